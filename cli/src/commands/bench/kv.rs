//! `fornax bench kv`: what the paged cache's precision tiers save and cost, side by side
//! with all-FP32 blocks and with the foundation's contiguous cache.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use fornax_backends::{BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{BlockPool, KvCapacity, KvDims, Tier, TierPolicy, BLOCK_TOKENS};
use fornax_engine::model::{LlamaModel, Logits, SeqTokens};
use fornax_engine::sampling::argmax;
use fornax_engine::score::{perplexity, token_logprobs_in};
use fornax_engine::seq_cache::{PagedSeq, SeqCache};
use fornax_engine::{logits_to_vec, prefill, EngineBackend};

use super::super::{load_model, parse, tokenizer, ModelArgs};

#[derive(Args, Debug)]
pub struct KvBenchArgs {
    /// Context length of the bytes-per-token figure.
    #[arg(long, default_value_t = 4096)]
    pub context: usize,
    /// Text scored for perplexity.
    #[arg(long, default_value = "tests/reference/ppl_text.txt")]
    pub text: PathBuf,
    /// Tokens per forward pass while scoring (blocks convert between passes).
    #[arg(long, default_value_t = 32)]
    pub chunk: usize,
    /// Blocks older than this many tokens go to INT8 in the INT8 column.
    #[arg(long, default_value_t = 512)]
    pub int8_after: usize,
    /// Sequences decoded together in the batched figure.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Decode steps timed.
    #[arg(long, default_value_t = 16)]
    pub steps: usize,
    /// Prompt tokens of each sequence before decoding.
    #[arg(long, default_value_t = 64)]
    pub prompt_tokens: usize,
    /// KV cache budget in MiB.
    #[arg(long, default_value_t = 256)]
    pub kv_memory: usize,
    /// Skip the perplexity runs (slow on software adapters).
    #[arg(long)]
    pub no_perplexity: bool,
    #[command(flatten)]
    pub model: ModelArgs,
}

struct KvBench<'a> {
    args: &'a KvBenchArgs,
    gguf: &'a GgufFile<'a>,
    text: Vec<u32>,
}

fn policies(int8_after: usize) -> [(String, TierPolicy); 3] {
    [
        ("FP32".into(), TierPolicy::ALL_F32),
        ("default (FP16 after 128)".into(), TierPolicy::DEFAULT),
        (
            format!("FP16 after 128, INT8 after {int8_after}"),
            TierPolicy {
                recent: Some(128),
                int8_after: Some(int8_after),
            },
        ),
    ]
}

/// Device bytes per token of one sequence of `context` tokens under `policy`.
fn bytes_per_token(dims: KvDims, policy: TierPolicy, context: usize) -> f64 {
    let blocks = context.div_ceil(BLOCK_TOKENS) + 1;
    let mut pool = BlockPool::new(KvCapacity { slots: [blocks; 3] }, policy);
    let seq = pool.add_sequence();
    pool.reserve(seq, context).expect("sized above");
    pool.advance(seq, context).expect("reserved");
    let used = pool.stats().blocks_used_by_tier;
    let bytes: usize = Tier::ALL
        .iter()
        .map(|&t| used[t.index()] * dims.block_bytes(t))
        .sum();
    bytes as f64 / context as f64
}

impl KvBench<'_> {
    fn capacity<B: EngineBackend>(
        &self,
        model: &LlamaModel<B>,
        policy: TierPolicy,
        seqs: usize,
    ) -> KvCapacity {
        let chunk = self.args.chunk.max(self.args.prompt_tokens);
        KvCapacity::from_budget(
            self.args.kv_memory << 20,
            model.kv_dims(),
            policy,
            seqs,
            chunk,
        )
    }

    fn prompts(&self, n: usize) -> Vec<Vec<u32>> {
        let len = self.args.prompt_tokens;
        (0..n)
            .map(|i| {
                let start = (i * 37) % self.text.len().saturating_sub(len).max(1);
                self.text[start..start + len].to_vec()
            })
            .collect()
    }

    /// Decode tokens/s of `n` sequences, each over its own contiguous cache.
    fn contiguous_decode<B: EngineBackend>(&self, model: &LlamaModel<B>, n: usize) -> Result<f64> {
        let mut caches: Vec<_> = (0..n).map(|_| model.new_cache()).collect();
        let mut next = Vec::new();
        for (cache, prompt) in caches.iter_mut().zip(self.prompts(n)) {
            next.push(argmax(&prefill(model, &prompt, cache, 256)?));
        }
        let t = Instant::now();
        for _ in 0..self.args.steps {
            for (cache, token) in caches.iter_mut().zip(next.iter_mut()) {
                *token = argmax(&logits_to_vec(cache.forward(
                    model,
                    &[*token],
                    Logits::Last,
                )?));
            }
        }
        Ok((n * self.args.steps) as f64 / t.elapsed().as_secs_f64())
    }

    /// Decode tokens/s of `n` sequences batched in one forward pass per step.
    fn paged_decode<B: EngineBackend>(&self, model: &LlamaModel<B>, n: usize) -> Result<f64> {
        let policy = TierPolicy::DEFAULT;
        let mut kv = model.new_paged_cache(self.capacity(model, policy, n), policy);
        let seqs: Vec<_> = (0..n).map(|_| kv.add_sequence()).collect();
        let prompts = self.prompts(n);
        let batch: Vec<SeqTokens> = seqs
            .iter()
            .zip(&prompts)
            .map(|(&seq, p)| SeqTokens { seq, tokens: p })
            .collect();
        let logits = logits_to_vec(model.forward_batch(&batch, &mut kv, Logits::Last)?);
        let vocab = model.config.vocab_size;
        let mut next: Vec<[u32; 1]> = logits.chunks(vocab).map(|l| [argmax(l)]).collect();
        let t = Instant::now();
        for _ in 0..self.args.steps {
            let batch: Vec<SeqTokens> = seqs
                .iter()
                .zip(&next)
                .map(|(&seq, tok)| SeqTokens { seq, tokens: tok })
                .collect();
            let logits = logits_to_vec(model.forward_batch(&batch, &mut kv, Logits::Last)?);
            next = logits.chunks(vocab).map(|l| [argmax(l)]).collect();
        }
        Ok((n * self.args.steps) as f64 / t.elapsed().as_secs_f64())
    }
}

impl BackendTask for KvBench<'_> {
    type Output = Result<()>;

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) -> Result<()> {
        let a = self.args;
        let model = load_model::<B>(self.gguf, &device, a.model.load_options())?;
        let dims = model.kv_dims();
        println!("backend: {} | adapter: {}", info.kind, info.adapter);
        println!(
            "model KV: {} layers x {} kv heads x {} dims; block = {BLOCK_TOKENS} tokens",
            dims.n_layers, dims.n_kv_heads, dims.head_dim
        );

        println!("\nKV bytes per token at {} tokens of context:", a.context);
        let f32_bytes = bytes_per_token(dims, TierPolicy::ALL_F32, a.context);
        for (name, policy) in policies(a.int8_after) {
            let b = bytes_per_token(dims, policy, a.context);
            println!(
                "  {name:<34} {b:>9.0} B/token  {:>6.1}% smaller than FP32",
                100.0 * (1.0 - b / f32_bytes)
            );
        }

        if !a.no_perplexity {
            println!(
                "\nperplexity of {} ({} tokens, {} per forward pass):",
                a.text.display(),
                self.text.len(),
                a.chunk
            );
            let t = Instant::now();
            let base = perplexity(&token_logprobs_in(
                &model,
                &mut model.new_cache(),
                &self.text,
                a.chunk,
            )?);
            println!(
                "  {:<34} {base:>9.4}  ({:.0} s)",
                "contiguous cache (foundation)",
                t.elapsed().as_secs_f64()
            );
            let mut fp32 = None;
            for (name, policy) in policies(a.int8_after) {
                let t = Instant::now();
                let mut kv = model.new_paged_cache(self.capacity(&model, policy, 1), policy);
                let mut seq = PagedSeq::new(&mut kv);
                let ppl = perplexity(&token_logprobs_in(&model, &mut seq, &self.text, a.chunk)?);
                drop(seq);
                let reference = *fp32.get_or_insert(ppl);
                println!(
                    "  {name:<34} {ppl:>9.4}  {:+.3}% vs FP32 blocks  ({} conversions, {:.0} s)",
                    100.0 * (ppl / reference - 1.0),
                    kv.stats().conversions,
                    t.elapsed().as_secs_f64()
                );
            }
        }

        println!(
            "\ndecode tokens/s ({} prompt tokens per sequence, {} steps timed):",
            a.prompt_tokens, a.steps
        );
        println!(
            "  {:<10} {:>22} {:>26}",
            "batch", "contiguous (one by one)", "paged, default tiers (batched)"
        );
        for n in [1, a.batch] {
            let contiguous = self.contiguous_decode(&model, n)?;
            let paged = self.paged_decode(&model, n)?;
            println!(
                "  {n:<10} {contiguous:>22.2} {paged:>26.2}   ({:.2}x)",
                paged / contiguous
            );
        }
        Ok(())
    }
}

pub fn run(args: KvBenchArgs) -> Result<()> {
    let file = args.model.open()?;
    let gguf = parse(&file)?;
    let tok = tokenizer(&gguf)?;
    let text = std::fs::read_to_string(&args.text)
        .with_context(|| format!("cannot read {} (pass --text FILE)", args.text.display()))?;
    let text = tok.encode(&text, false)?;
    anyhow::ensure!(
        text.len() > args.prompt_tokens,
        "the text is shorter than --prompt-tokens"
    );
    args.model.run_on(KvBench {
        args: &args,
        gguf: &gguf,
        text,
    })?
}
