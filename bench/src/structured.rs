//! `fornax bench structured`: the cost of constrained decoding. The same requests (one
//! chat prompt, sampled at temperature 0.7, a fixed number of tokens each) decode at each
//! batch size with and without a JSON schema whose output runs past them, alternated
//! (A B A B); then each constrained output is replayed through a fresh constraint, timing
//! the token mask of every step (median and P99).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use fornax_backends::{BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::grammar::{Grammar, GrammarCompiler};
use fornax_engine::kv::{KvCapacity, TierPolicy, BLOCK_TOKENS};
use fornax_engine::model::Model;
use fornax_engine::sampling::SamplingParams;
use fornax_engine::sched::{PolicyKind, SchedulerConfig};
use fornax_engine::tokenizer::{ChatMessage, Tokenizer};
use fornax_engine::{Engine, EngineBackend, Event, Request};

use crate::load::percentile;
use crate::median;
use fornax_options::{load_model, parse, tokenizer, ModelArgs};

#[derive(Args, Debug)]
pub struct StructuredArgs {
    /// Batch sizes (requests decoding together).
    #[arg(long, num_args = 1.., default_values_t = [1, 32])]
    pub sequences: Vec<usize>,
    /// Tokens each request generates.
    #[arg(long, default_value_t = 64)]
    pub tokens: usize,
    /// Rounds of the alternation (each runs both).
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// People as JSON, more of them than any run reaches: the grammar never ends a request.
fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "array",
        "minItems": 1000,
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 30},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "city": {"type": "string", "maxLength": 30},
                "member": {"type": "boolean"}
            },
            "required": ["name", "age", "city", "member"],
            "additionalProperties": false
        }
    })
}

struct Structured<'a> {
    args: &'a StructuredArgs,
    gguf: &'a GgufFile<'a>,
    tok: Arc<Tokenizer>,
}

impl Structured<'_> {
    /// Decodes `n` requests together, constrained or not; returns the seconds per output
    /// token (of the whole run, prefill included) and each request's tokens.
    fn run_batch<B: EngineBackend>(
        &self,
        model: &Model<B>,
        compiler: &GrammarCompiler,
        n: usize,
        constrained: bool,
    ) -> Result<(f64, Vec<Vec<u32>>)> {
        let a = self.args;
        let prompt = self
            .tok
            .encode_chat(&[ChatMessage::new("user", "List people as JSON.")])?;
        let per_seq = (prompt.len() + a.tokens).div_ceil(BLOCK_TOKENS) + 1;
        let kv = model.new_paged_cache(KvCapacity::f32_only(n * per_seq), TierPolicy::ALL_F32);
        let config = SchedulerConfig {
            max_batch: n,
            ..SchedulerConfig::default()
        };
        let mut engine = Engine::new(model, kv, config, PolicyKind::default());
        let grammar = Grammar::JsonSchema(schema());
        let mut ids = std::collections::HashMap::new();
        let t = Instant::now();
        for i in 0..n {
            let constraint = match constrained {
                true => Some(compiler.compile(&grammar)?),
                false => None,
            };
            let request = Request {
                prompt: prompt.clone(),
                max_tokens: a.tokens,
                qos: 0,
                sampling: SamplingParams {
                    temperature: 0.7,
                    seed: i as u64,
                    ..SamplingParams::greedy()
                },
                stop_ids: Vec::new(),
                constraint,
                logprobs: None,
                prompt_logprobs: None,
            };
            ids.insert(engine.submit(request)?, i);
        }
        let mut out = vec![Vec::new(); n];
        while !engine.is_idle() {
            for event in engine.step()? {
                if let Event::Token { id, token, .. } = event {
                    out[ids[&id]].push(token);
                }
            }
        }
        let tokens: usize = out.iter().map(Vec::len).sum();
        Ok((t.elapsed().as_secs_f64() / tokens as f64, out))
    }
}

impl BackendTask for Structured<'_> {
    type Output = Result<()>;

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) -> Result<()> {
        let a = self.args;
        let model: Model<B> = load_model::<B>(self.gguf, &device, a.model.load_options())?;
        let compiler = GrammarCompiler::new(self.tok.clone())?;
        let t = Instant::now();
        compiler.compile(&Grammar::JsonSchema(schema()))?;
        println!(
            "bench structured: {} backend, vocabulary of {} tokens, {} tokens a request, schema compiled in {:.1} ms",
            info.kind,
            self.tok.vocab_size(),
            a.tokens,
            t.elapsed().as_secs_f64() * 1e3
        );
        // Warm-up: first-call costs stay out of the figures.
        self.run_batch(&model, &compiler, 1, true)?;
        println!(
            "{:>9} {:>16} {:>16} {:>7}",
            "sequences", "free ms/token", "schema ms/token", "ratio"
        );
        let mut outputs = Vec::new();
        for &n in &a.sequences {
            let (mut free, mut schema) = (Vec::new(), Vec::new());
            for _ in 0..a.rounds {
                free.push(self.run_batch(&model, &compiler, n, false)?.0);
                let (s, out) = self.run_batch(&model, &compiler, n, true)?;
                schema.push(s);
                outputs = out;
            }
            let (f, s) = (median(free), median(schema));
            println!("{n:>9} {:>16.2} {:>16.2} {:>7.3}", f * 1e3, s * 1e3, s / f);
        }
        let (mut masks, mut feeds) = (Vec::new(), Vec::new());
        for tokens in &outputs {
            let mut c = compiler.compile(&Grammar::JsonSchema(schema()))?;
            for &token in tokens {
                let t = Instant::now();
                let mask = c.mask()?;
                masks.push(t.elapsed());
                anyhow::ensure!(mask.allows(token), "token {token} was not allowed");
                let t = Instant::now();
                c.consume(&[token])?;
                feeds.push(t.elapsed());
            }
        }
        let feeds: Vec<f64> = feeds.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        println!(
            "feeding a token back: median {:.0} µs, P99 {:.0} µs",
            percentile(&feeds, 0.5),
            percentile(&feeds, 0.99)
        );
        let us: Vec<f64> = masks
            .iter()
            .map(|d: &Duration| d.as_secs_f64() * 1e6)
            .collect();
        println!(
            "mask per step over {} steps: median {:.0} µs, P99 {:.0} µs",
            us.len(),
            percentile(&us, 0.5),
            percentile(&us, 0.99)
        );
        Ok(())
    }
}

pub fn run(args: StructuredArgs) -> Result<()> {
    anyhow::ensure!(
        args.sequences.iter().all(|&n| n > 0) && args.tokens > 0 && args.rounds > 0,
        "need sequences, tokens and rounds"
    );
    let file = args.model.open()?;
    let gguf = parse(&file)?;
    let tok = Arc::new(tokenizer(&gguf)?);
    args.model.run_on(Structured {
        args: &args,
        gguf: &gguf,
        tok,
    })?
}
