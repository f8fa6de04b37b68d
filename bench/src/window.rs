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

use crate::load::{percentile, read_text, serve_jobs, Figures, LoadArgs, LoadBench, Mode, Serving};
use fornax_options::kv::KvArgs;
use fornax_options::{load_model, parse};

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
        model: &fornax_engine::model::Model<B>,
        ids: &[u32],
        window: Option<(usize, usize)>,
    ) -> Result<f64> {
        // Room for the whole text in every tier: the pool's size does not matter here.
        let n = ids.len().div_ceil(32) + 1;
        let capacity = KvCapacity::tiers([n; 3]);
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
        println!(
            "backend: {} | adapter: {} | dtype: {}",
            info.kind, info.adapter, info.dtype
        );
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
        println!("| window | tokens/min | TTFT P50 s | TTFT P99 s | end-to-end P50 s | P99 s | preemptions | tokens recomputed after preemption | trims | tokens dropped | tokens computed | failed |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
        // Full window without and (when asked for) with the host tier, then elastic.
        let no_host = KvArgs {
            kv_host_memory: 0,
            ..l.kv.clone()
        };
        let mut runs = vec![("full", None, &no_host)];
        if l.kv.kv_host_memory > 0 {
            runs.push(("full, host tier", None, &l.kv));
        }
        runs.push(("elastic", Some(w), &no_host));
        let mut rows: Vec<Figures> = Vec::new();
        for &(name, window, kv) in &runs {
            let serving = Serving {
                sched: &l.sched,
                kv,
                mode: Mode::Continuous,
                policy: l.sched.policy,
                config: fornax_engine::sched::SchedulerConfig {
                    window,
                    ..l.sched.config()
                },
                timeout: None,
            };
            let f = serve_jobs(&model, &jobs, &serving)?;
            println!(
                "| {name} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {} |",
                f.tokens_per_min(),
                percentile(&f.ttft, 0.5),
                percentile(&f.ttft, 0.99),
                percentile(&f.e2e, 0.5),
                percentile(&f.e2e, 0.99),
                f.preemptions,
                f.recomputed,
                f.kv.window_trims,
                f.kv.window_dropped_tokens,
                f.computed,
                f.failed
            );
            rows.push(f);
        }
        let (off, on) = (&rows[0], &rows[rows.len() - 1]);
        println!(
            "elastic vs full: throughput {:.2}x, end-to-end P99 {:.2}x lower, {:.0}% fewer tokens computed",
            on.tokens_per_min() / off.tokens_per_min(),
            percentile(&off.e2e, 0.99) / percentile(&on.e2e, 0.99),
            (1.0 - on.computed as f64 / off.computed as f64) * 100.0
        );
        if let [off, host, _] = &rows[..] {
            let h = host.host.unwrap_or_default();
            println!(
                "host tier ({} MiB) vs none: {:.2}x fewer tokens recomputed after preemptions ({} vs {}), throughput {:.2}x; {} blocks stored in host memory, {} brought back, {} dropped",
                l.kv.kv_host_memory,
                off.recomputed as f64 / host.recomputed.max(1) as f64,
                host.recomputed,
                off.recomputed,
                host.tokens_per_min() / off.tokens_per_min(),
                h.stored,
                h.restored,
                h.dropped
            );
            let same = off
                .outputs
                .iter()
                .zip(&host.outputs)
                .filter(|(a, b)| a == b)
                .count();
            println!(
                "outputs with the host tier equal to those without: {same} of {} requests",
                off.outputs.len()
            );
        }
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
