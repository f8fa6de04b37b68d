//! `fornax bench single`: one sequence's prefill and decode speed.

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use fornax_backends::{run_on, BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::model::Logits;
use fornax_engine::tokenizer::Tokenizer;
use fornax_engine::{logits_to_vec, prefill};

use super::super::{load_model, parse, tokenizer, ModelArgs};

#[derive(Args, Debug)]
pub struct SingleArgs {
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Tokens decoded per run.
    #[arg(long, default_value_t = 32)]
    pub gen_tokens: usize,
    /// Measured runs (after one warm-up run).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    #[command(flatten)]
    pub model: ModelArgs,
}

struct Single<'a> {
    args: &'a SingleArgs,
    gguf: &'a GgufFile<'a>,
    tok: &'a Tokenizer,
}

use super::median;

impl BackendTask for Single<'_> {
    type Output = Result<()>;

    fn run<B: fornax_engine::EngineBackend>(
        self,
        device: B::Device,
        info: DeviceInfo,
    ) -> Result<()> {
        let a = self.args;
        let t = Instant::now();
        let model = load_model::<B>(self.gguf, &device)?;
        let load_s = t.elapsed().as_secs_f64();
        // A prompt of the requested length cut from real text.
        let text = "The history of computing is a story of abstractions built on abstractions. "
            .repeat(a.prompt_tokens);
        let prompt: Vec<u32> = self
            .tok
            .encode(&text, false)?
            .into_iter()
            .take(a.prompt_tokens)
            .collect();
        let (mut prefill_tps, mut decode_tps) = (Vec::new(), Vec::new());
        for run in 0..=a.runs {
            let mut cache = model.new_cache();
            let t = Instant::now();
            let mut logits = prefill(&model, &prompt, &mut cache, 256)?;
            let prefill_s = t.elapsed().as_secs_f64();
            let t = Instant::now();
            for _ in 0..a.gen_tokens {
                let next = fornax_engine::sampling::argmax(&logits);
                logits = logits_to_vec(model.forward(&[next], &mut cache, Logits::Last)?);
            }
            let decode_s = t.elapsed().as_secs_f64();
            if run > 0 {
                prefill_tps.push(prompt.len() as f64 / prefill_s);
                decode_tps.push(a.gen_tokens as f64 / decode_s);
            }
        }
        println!("backend: {} | adapter: {}", info.kind, info.adapter);
        println!("load: {load_s:.2} s");
        println!(
            "prefill: {:.1} tokens/s (prompt {} tokens, median of {} runs)",
            median(prefill_tps),
            prompt.len(),
            a.runs
        );
        println!(
            "decode:  {:.2} tokens/s ({} tokens after the prompt, median of {} runs)",
            median(decode_tps),
            a.gen_tokens,
            a.runs
        );
        Ok(())
    }
}

pub fn run(args: SingleArgs) -> Result<()> {
    let file = args.model.open()?;
    let gguf = parse(&file)?;
    let tok = tokenizer(&gguf)?;
    run_on(
        args.model.backend,
        Single {
            args: &args,
            gguf: &gguf,
            tok: &tok,
        },
    )?
}
