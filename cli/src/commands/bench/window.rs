//! `fornax bench window`: what the elastic KV window costs and buys, side by side with
//! full caches. Perplexity of a text scored with the window held at W(B) for several batch
//! sizes B, and a burst of requests on a KV pool too small for them, served with the
//! window off (preempting) and on (trimming).

use anyhow::Result;
use clap::Args;
use fornax_backends::{BackendTask, DeviceInfo};
use fornax_engine::kv::KvCapacity;
use fornax_engine::score::{perplexity, token_logprobs_in};
use fornax_engine::seq_cache::PagedSeq;
use fornax_engine::EngineBackend;

use super::super::{load_model, parse};
use super::load::{percentile, read_text, Figures, LoadArgs, LoadBench, Mode};

#[derive(Args, Debug)]
pub struct WindowBenchArgs {
    /// Batch sizes B whose window W(B) perplexity is scored with.
    #[arg(long, num_args = 1.., default_values_t = [1, 8, 32, 64, 128])]
    pub batch_sizes: Vec<usize>,
    /// Tokens of the text scored for perplexity (default: all of it).
    #[arg(long)]
    pub ppl_tokens: Option<usize>,
    /// Skip the perplexity runs.
    #[arg(long)]
    pub no_perplexity: bool,
    /// The burst served with the window off and on (its `--text` is also the text
    /// scored), with the window's parameters (`--kv-window-a`, ...).
    #[command(flatten)]
    pub load: LoadArgs,
}

struct WindowBench<'a> {
    args: &'a WindowBenchArgs,
    load: LoadBench<'a>,
}

impl WindowBench<'_> {
    /// Perplexity of `ids` scored 32 tokens at a time, the sequence trimmed to its sink
    /// blocks and newest `window` tokens before each pass (`None`: the full cache), with
    /// the tier policy of the flags.
    fn perplexity<B: EngineBackend>(
        &self,
        model: &fornax_engine::model::LlamaModel<B>,
        ids: &[u32],
        window: Option<(usize, usize)>,
    ) -> Result<f64> {
        // Room for the whole text in every tier: the pool's size does not matter here.
        let n = ids.len().div_ceil(32) + 1;
        let capacity = KvCapacity { slots: [n; 3] };
        let mut kv = model.new_paged_cache(capacity, self.args.load.kv.policy());
        let mut seq = PagedSeq::with_window(&mut kv, window);
        Ok(perplexity(&token_logprobs_in(model, &mut seq, ids, 32)?))
    }
}

impl BackendTask for WindowBench<'_> {
    type Output = Result<()>;

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) -> Result<()> {
        let a = self.args;
        let l = &a.load;
        let model = load_model::<B>(self.load.gguf, &device, l.model.load_options())?;
        let text = read_text(&l.text, self.load.gguf)?;
        let w = l.sched.elastic.elastic();
        println!("backend: {} | adapter: {}", info.kind, info.adapter);
        println!(
            "elastic window: W = min(L_max, {} sqrt(B) + {}), L_max {}, {} sink block(s) of 32 tokens",
            w.a,
            w.b,
            w.max_tokens.min(model.config.max_seq_len),
            w.sink_blocks
        );

        if !a.no_perplexity {
            let ids = &text[..a.ppl_tokens.unwrap_or(text.len()).min(text.len())];
            println!(
                "\nperplexity of {} ({} tokens, 32 per forward pass; each pass sees the sinks and at least the newest W tokens):",
                l.text.display(),
                ids.len()
            );
            println!("| cache | W tokens | perplexity | vs full |");
            println!("|---|---|---|---|");
            let full = self.perplexity(&model, ids, None)?;
            println!("| full | {} | {full:.4} | |", ids.len());
            for &b in &a.batch_sizes {
                let tokens = w.tokens(b).min(model.config.max_seq_len);
                let ppl = self.perplexity(&model, ids, Some((w.sink_blocks, tokens)))?;
                println!(
                    "| elastic, B = {b} | {tokens} | {ppl:.4} | {:+.2}% |",
                    (ppl / full - 1.0) * 100.0
                );
            }
        }

        let jobs = self.load.burst(&text);
        println!(
            "\nunder pressure: {} requests at once (seed {}), prompts {}..={} tokens, outputs {}..={} tokens, KV pool {} MiB, max batch {}",
            l.requests, l.seed, l.prompt_tokens[0], l.prompt_tokens[1], l.output_tokens[0], l.output_tokens[1], l.kv.kv_memory, l.sched.max_batch
        );
        println!("| window | tokens/min | TTFT P50 s | TTFT P99 s | end-to-end P50 s | P99 s | preemptions | trims | tokens dropped | tokens computed | failed |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        let mut rows: Vec<Figures> = Vec::new();
        for window in [None, Some(w)] {
            let config = fornax_engine::sched::SchedulerConfig {
                window,
                ..l.sched.config()
            };
            let f =
                self.load
                    .serve_with(&model, &jobs, Mode::Continuous, l.sched.policy, config)?;
            println!(
                "| {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} |",
                if window.is_some() { "elastic" } else { "full" },
                f.tokens_per_min(),
                percentile(&f.ttft, 0.5),
                percentile(&f.ttft, 0.99),
                percentile(&f.e2e, 0.5),
                percentile(&f.e2e, 0.99),
                f.preemptions,
                f.kv.window_trims,
                f.kv.window_dropped_tokens,
                f.computed,
                f.failed
            );
            rows.push(f);
        }
        let (off, on) = (&rows[0], &rows[1]);
        println!(
            "elastic vs full: throughput {:.2}x, end-to-end P99 {:.2}x lower, {:.0}% fewer tokens computed",
            on.tokens_per_min() / off.tokens_per_min(),
            percentile(&off.e2e, 0.99) / percentile(&on.e2e, 0.99),
            (1.0 - on.computed as f64 / off.computed as f64) * 100.0
        );
        Ok(())
    }
}

pub fn run(args: WindowBenchArgs) -> Result<()> {
    let file = args.load.model.open()?;
    let gguf = parse(&file)?;
    let task = WindowBench {
        args: &args,
        load: LoadBench {
            args: &args.load,
            gguf: &gguf,
        },
    };
    args.load.model.run_on(task)?
}
