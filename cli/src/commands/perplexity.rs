//! `fornax perplexity`: score a text file (no BOS, like the reference scorer).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use fornax_backends::{BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::model::LoadOptions;
use fornax_engine::score::{perplexity, token_logprobs_in};
use fornax_engine::seq_cache::PagedSeq;
use fornax_engine::tokenizer::Tokenizer;

use fornax_options::kv::KvArgs;
use fornax_options::{load_model, parse, tokenizer, ModelArgs};

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    /// Text file to score.
    pub file: PathBuf,
    /// Tokens per forward pass.
    #[arg(long, default_value_t = 256)]
    pub chunk: usize,
    #[command(flatten)]
    pub kv: KvArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

struct Score<'a> {
    ids: Vec<u32>,
    chunk: usize,
    kv: KvArgs,
    load: LoadOptions,
    gguf: &'a GgufFile<'a>,
}

impl BackendTask for Score<'_> {
    type Output = Result<()>;

    fn run<B: fornax_engine::EngineBackend>(
        self,
        device: B::Device,
        info: DeviceInfo,
    ) -> Result<()> {
        let model = load_model::<B>(self.gguf, &device, self.load)?;
        let t = Instant::now();
        let logprobs = if self.kv.contiguous_kv {
            token_logprobs_in(&model, &mut model.new_cache(), &self.ids, self.chunk)?
        } else {
            let capacity = self.kv.capacity(model.kv_dims(), 1, self.chunk)?;
            let mut kv = model.new_paged_cache(capacity, self.kv.policy());
            let mut seq = PagedSeq::new(&mut kv);
            let logprobs = token_logprobs_in(&model, &mut seq, &self.ids, self.chunk)?;
            drop(seq);
            logprobs
        };
        let secs = t.elapsed().as_secs_f64();
        let ppl = perplexity(&logprobs);
        println!(
            "backend: {} | adapter: {} | dtype: {}",
            info.kind, info.adapter, info.dtype
        );
        println!(
            "perplexity: {ppl:.4} over {} scored tokens (mean NLL {:.5}), {:.1} tokens/s",
            logprobs.len(),
            ppl.ln(),
            self.ids.len() as f64 / secs
        );
        Ok(())
    }
}

fn encode(tok: &Tokenizer, path: &PathBuf) -> Result<Vec<u32>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(tok.encode_prompt(&text, false)?)
}

pub fn run(args: PerplexityArgs) -> Result<()> {
    let file = args.model.open()?;
    let gguf = parse(&file)?;
    let ids = encode(&tokenizer(&gguf)?, &args.file)?;
    let task = Score {
        ids,
        chunk: args.chunk,
        kv: args.kv.clone(),
        load: args.model.load_options(),
        gguf: &gguf,
    };
    args.model.run_on(task)?
}
