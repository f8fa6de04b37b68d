//! `fornax bench case`: one measured case as a JSON line, for scripts that compare engines
//! (`scripts/bench-peer.sh`). `sequences` prompts of `prompt_tokens` are prefilled one
//! after another, then all sequences decode `gen_tokens` steps together, one batched
//! forward pass per step over the paged cache (the server's path), greedy.

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use fornax_backends::{BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{KvCapacity, SeqId, TierPolicy, BLOCK_TOKENS};
use fornax_engine::model::{Logits, Model, SeqTokens};
use fornax_engine::sampling::argmax_rows;
use fornax_engine::EngineBackend;

use crate::text_prompt;
use fornax_options::{load_model, parse, tokenizer, ModelArgs};

#[derive(Args, Debug)]
pub struct CaseArgs {
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Decode steps (tokens per sequence).
    #[arg(long, default_value_t = 32)]
    pub gen_tokens: usize,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 1)]
    pub sequences: usize,
    #[command(flatten)]
    pub model: ModelArgs,
}

struct Case<'a> {
    args: &'a CaseArgs,
    gguf: &'a GgufFile<'a>,
    prompt: Vec<u32>,
}

/// Each row's greedy token, chosen where the logits are (on a GPU one read-back of the
/// ids, as the engine does, not of every logit).
fn next_tokens<B: EngineBackend>(logits: burn_tensor::Tensor<B, 2>) -> Vec<[u32; 1]> {
    argmax_rows(logits).into_iter().map(|t| [t]).collect()
}

impl BackendTask for Case<'_> {
    type Output = Result<()>;

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) -> Result<()> {
        let a = self.args;
        let model: Model<B> = load_model::<B>(self.gguf, &device, a.model.load_options())?;
        let per_seq = (a.prompt_tokens + a.gen_tokens).div_ceil(BLOCK_TOKENS) + 1;
        let capacity = KvCapacity::f32_only((a.sequences + 1) * per_seq);
        let mut kv = model.new_paged_cache(capacity, TierPolicy::ALL_F32);
        // Warm-up on a sequence of its own: first-call costs stay out of the figures.
        let warm = kv.add_sequence();
        let part = &self.prompt[..self.prompt.len().min(16)];
        model.forward_batch(
            &[SeqTokens {
                seq: warm,
                tokens: part,
            }],
            &mut kv,
            Logits::Last,
        )?;
        kv.free_sequence(warm)?;

        let seqs: Vec<SeqId> = (0..a.sequences).map(|_| kv.add_sequence()).collect();
        let t = Instant::now();
        let mut next = Vec::new();
        for &seq in &seqs {
            let batch = [SeqTokens {
                seq,
                tokens: &self.prompt,
            }];
            next.extend(next_tokens(model.forward_batch(
                &batch,
                &mut kv,
                Logits::Last,
            )?));
        }
        let prefill_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..a.gen_tokens {
            let batch: Vec<SeqTokens> = seqs
                .iter()
                .zip(&next)
                .map(|(&seq, tok)| SeqTokens { seq, tokens: tok })
                .collect();
            next = next_tokens(model.forward_batch(&batch, &mut kv, Logits::Last)?);
        }
        let decode_s = t.elapsed().as_secs_f64();
        let json = serde_json::json!({
            "engine": "fornax",
            "backend": info.kind.to_string(),
            "adapter": info.adapter,
            "dtype": info.dtype.to_string(),
            "prompt_tokens": self.prompt.len(),
            "gen_tokens": a.gen_tokens,
            "sequences": a.sequences,
            "prefill_tok_s": (a.sequences * self.prompt.len()) as f64 / prefill_s,
            "decode_tok_s": (a.sequences * a.gen_tokens) as f64 / decode_s,
        });
        println!("{json}");
        Ok(())
    }
}

pub fn run(args: CaseArgs) -> Result<()> {
    anyhow::ensure!(
        args.sequences > 0 && args.prompt_tokens > 0,
        "need a sequence and a prompt"
    );
    let file = args.model.open()?;
    let gguf = parse(&file)?;
    let prompt = text_prompt(&tokenizer(&gguf)?, args.prompt_tokens)?;
    args.model.run_on(Case {
        args: &args,
        gguf: &gguf,
        prompt,
    })?
}
