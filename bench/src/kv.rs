//! `fornax bench kv`: what the paged cache's precision tiers save and cost, side by side
//! with all-FP32 blocks and with the foundation's contiguous cache.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use fornax_backends::{BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{BlockPool, KvCapacity, KvDims, Tier, TierPolicy, BLOCK_TOKENS};
use fornax_engine::model::{LoadOptions, Logits, Model, SeqTokens};
use fornax_engine::sampling::argmax;
use fornax_engine::score::{perplexity, token_logprobs_in};
use fornax_engine::seq_cache::{PagedSeq, SeqCache};
use fornax_engine::{logits_to_vec, prefill, EngineBackend};

use fornax_options::{load_model, parse, tokenizer, ModelArgs};

#[derive(Args, Debug)]
pub struct KvBenchArgs {
    /// Context lengths of the bytes-per-token figures.
    #[arg(long, value_delimiter = ',', default_value = "4096,32768")]
    pub context: Vec<usize>,
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
    /// Score the text this many times, from its first, second, ... token, and pool the
    /// scores: on the quantized CPU path each start is an independent draw of the 8-bit
    /// rounding noise, so the standard error falls as 1 / sqrt(draws).
    #[arg(long, default_value_t = 1)]
    pub draws: usize,
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

/// Device bytes per token of one sequence of `context` tokens under `policy`, run in
/// steps of 512 tokens as the engine's pools keep them: the main pool's blocks at their
/// tiers' sizes, plus the sliding pool's (windowed layers, FP32), which gives back every
/// block its window has passed after each step.
fn bytes_per_token(dims: KvDims, policy: TierPolicy, context: usize) -> f64 {
    const STEP: usize = 512;
    let blocks = context.div_ceil(BLOCK_TOKENS) + 1;
    let mut main = BlockPool::new(KvCapacity::tiers([blocks; 3]), policy);
    let mut sliding = BlockPool::new(KvCapacity::f32_only(blocks), TierPolicy::ALL_F32);
    let seq = main.add_sequence();
    sliding.add_sequence_as(seq);
    let window = dims.windowed().map(|(_, s)| s.keys);
    for start in (0..context).step_by(STEP) {
        let n = STEP.min(context - start);
        for pool in [&mut main, &mut sliding] {
            pool.reserve(seq, n).expect("sized above");
            pool.advance(seq, n).expect("reserved");
        }
        if let Some(keys) = window {
            sliding.trim_window(seq, 0, keys).expect("a sequence");
        }
    }
    let used = main.stats().blocks_used_by_tier;
    let bytes: usize = Tier::ALL
        .iter()
        .map(|&t| used[t.index()] * dims.block_bytes(t))
        .sum::<usize>()
        + sliding.stats().blocks_used * dims.sliding_block_bytes();
    bytes as f64 / context as f64
}

impl KvBench<'_> {
    fn capacity<B: EngineBackend>(
        &self,
        model: &Model<B>,
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

    /// Per-token log-probs of the text over a paged cache with `policy`; `kernels: false`
    /// reads the blocks with burn's attention instead of ours.
    fn paged_scores<B: EngineBackend>(
        &self,
        model: &Model<B>,
        text: &[u32],
        policy: TierPolicy,
        kernels: bool,
    ) -> Result<(Vec<f32>, u64)> {
        let mut kv = model.new_paged_cache(self.capacity(model, policy, 1), policy);
        kv.kernels = kernels;
        let mut seq = PagedSeq::new(&mut kv);
        let scores = token_logprobs_in(model, &mut seq, text, self.args.chunk)?;
        drop(seq);
        Ok((scores, kv.stats().conversions))
    }

    /// Every row of the perplexity table for one model: the per-token log-probs of each
    /// draw, pooled.
    fn perplexity_column<B: EngineBackend>(&self, model: &Model<B>) -> Result<Vec<Vec<f32>>> {
        let mut column = vec![Vec::new(); 2 + policies(self.args.int8_after).len()];
        for draw in 0..self.args.draws.max(1) {
            let text = &self.text[draw.min(self.text.len() - 2)..];
            let mut rows = vec![
                token_logprobs_in(model, &mut model.new_cache(), text, self.args.chunk)?,
                self.paged_scores(model, text, TierPolicy::ALL_F32, true)?.0,
                self.paged_scores(model, text, TierPolicy::ALL_F32, false)?
                    .0,
            ];
            for (_, policy) in &policies(self.args.int8_after)[1..] {
                let (scores, conversions) = self.paged_scores(model, text, *policy, true)?;
                anyhow::ensure!(
                    conversions > 0,
                    "no block converted: the text is too short for the tiers"
                );
                rows.push(scores);
            }
            for (pooled, scores) in column.iter_mut().zip(rows) {
                pooled.extend(scores);
            }
        }
        Ok(column)
    }

    /// The perplexity of the text under each tier policy, against FP32 blocks, on the
    /// loaded weights and, where those are quantized, on FP32 weights too (the reference
    /// path). A null row reads the same FP32 blocks with burn's attention: a change of
    /// summation order only, so its figures are what this path does with any tiny change.
    fn perplexity_table<B: EngineBackend>(
        &self,
        model: &Model<B>,
        device: &B::Device,
    ) -> Result<()> {
        let a = self.args;
        let t = Instant::now();
        let quantized = model.quantized();
        let mut columns = vec![(
            if quantized {
                "quantized weights"
            } else {
                "FP32 weights"
            },
            self.perplexity_column(model)?,
        )];
        if quantized {
            let options = LoadOptions {
                dequantize: true,
                ..a.model.load_options()
            };
            let reference = load_model::<B>(self.gguf, device, options)?;
            columns.push((
                "FP32 weights (reference)",
                self.perplexity_column(&reference)?,
            ));
        }
        println!(
            "\nperplexity of {} ({} tokens, {} per forward pass, {} draw(s); {:.0} s): change against FP32 blocks +- its standard error (rms change of a token's log-prob / sqrt(tokens scored))",
            a.text.display(),
            self.text.len(),
            a.chunk,
            a.draws.max(1),
            t.elapsed().as_secs_f64()
        );
        let mut names = vec![
            "contiguous cache (foundation)".to_string(),
            "FP32 blocks".to_string(),
            "FP32 blocks, burn's attention (null)".to_string(),
        ];
        names.extend(policies(a.int8_after)[1..].iter().map(|(n, _)| n.clone()));
        print!("  {:<38}", "");
        for (title, _) in &columns {
            print!(" {title:>34}");
        }
        println!();
        for (row, name) in names.iter().enumerate() {
            print!("  {name:<38}");
            for (_, column) in &columns {
                let (ppl, base) = (perplexity(&column[row]), perplexity(&column[1]));
                let rms = (column[row]
                    .iter()
                    .zip(&column[1])
                    .map(|(x, y)| f64::from(x - y).powi(2))
                    .sum::<f64>()
                    / column[1].len() as f64)
                    .sqrt();
                let error = 100.0 * rms / (column[1].len() as f64).sqrt();
                let cell = if row < 2 {
                    format!("{ppl:.4}")
                } else {
                    format!(
                        "{ppl:.4} {:+.3}% +- {error:.3}%",
                        100.0 * (ppl / base - 1.0)
                    )
                };
                print!(" {cell:>34}");
            }
            println!();
        }
        println!(
            "  The null row reads the same FP32 blocks with burn's attention, a change of summation order only. Where it moves token log-probs as much as a tier does (the CPU backend's quantized path: 8-bit activations, whose rounding any tiny change redraws downstream), a tier's change within two standard errors is that noise; --draws N pools N starts of the text."
        );
        Ok(())
    }

    /// Decode tokens/s of `n` sequences, each over its own contiguous cache.
    fn contiguous_decode<B: EngineBackend>(&self, model: &Model<B>, n: usize) -> Result<f64> {
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
    fn paged_decode<B: EngineBackend>(&self, model: &Model<B>, n: usize) -> Result<f64> {
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

/// The bytes-per-token table at `context` tokens: each tier policy, and for a model with
/// windowed layers the same with every layer keeping every block.
fn print_bytes_per_token(dims: KvDims, context: usize, int8_after: usize) {
    println!("\nKV bytes per token at {context} tokens of context:");
    let f32_bytes = bytes_per_token(dims, TierPolicy::ALL_F32, context);
    let dense = KvDims {
        sliding: None,
        ..dims
    };
    if let Some((_, s)) = dims.windowed() {
        println!(
            "  ({} of {} layers windowed over {} keys; \"all kept\": every layer keeps every block)",
            dims.members(true).len(),
            dims.n_layers,
            s.keys
        );
    }
    for (name, policy) in policies(int8_after) {
        let b = bytes_per_token(dims, policy, context);
        let mut line = format!(
            "  {name:<34} {b:>9.0} B/token  {:>6.1}% smaller than FP32",
            100.0 * (1.0 - b / f32_bytes)
        );
        if dims.sliding.is_some() {
            let all = bytes_per_token(dense, policy, context);
            line += &format!("  | all kept {all:>9.0} B/token, {:.2}x more", all / b);
        }
        println!("{line}");
    }
}

impl BackendTask for KvBench<'_> {
    type Output = Result<()>;

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) -> Result<()> {
        let a = self.args;
        let model = load_model::<B>(self.gguf, &device, a.model.load_options())?;
        let dims = model.kv_dims();
        println!(
            "backend: {} | adapter: {} | dtype: {}",
            info.kind, info.adapter, info.dtype
        );
        println!(
            "model KV: {} layers x {} kv heads x {} dims; block = {BLOCK_TOKENS} tokens",
            dims.n_layers, dims.n_kv_heads, dims.head_dim
        );

        for &context in &a.context {
            print_bytes_per_token(dims, context, a.int8_after);
        }

        if !a.no_perplexity {
            self.perplexity_table(&model, &device)?;
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
