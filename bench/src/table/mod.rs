//! `fornax bench table`: the seed's A/B test reproduced on one seeded customer-service
//! workload, in one sitting: "before" (one request at a time, contiguous FP32 KV, FP32
//! weights, operation by operation), "after" (everything on) and llama.cpp on the same
//! arrivals; the table, and SVG plots of the latency CDF and of throughput against
//! offered load.

mod before;
mod peer;
mod plots;
mod workload;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use fornax_backends::{BackendKind, BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::model::{LoadOptions, Model};
use fornax_engine::EngineBackend;

use crate::load::{percentile, serve_jobs, Figures, Job, Mode, Serving};
use fornax_options::kv::KvArgs;
use fornax_options::sched::SchedArgs;
use fornax_options::{load_model, parse, tokenizer, ModelArgs};
use peer::Peer;
use plots::Series;
use workload::{chat_turns, with_arrivals, ChatTurn, PeerWorkload, WorkloadShape};

#[derive(Args, Debug)]
pub struct TableArgs {
    /// Conversations in the workload (default: scaled to the device, 16 on the CPU
    /// backend, 128 on CUDA, 4 on wgpu).
    #[arg(long)]
    pub conversations: Option<usize>,
    /// Turns per conversation (each turn is a request carrying the history).
    #[arg(long, default_value_t = 3)]
    pub turns: usize,
    /// Output length range in tokens (inclusive).
    #[arg(long, num_args = 2, default_values_t = [16, 48])]
    pub output_tokens: Vec<usize>,
    /// Seed of the workload and its arrivals.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Offered load of the table, as a fraction of the measured capacity of "after".
    #[arg(long, default_value_t = 0.8)]
    pub load: f64,
    /// Offered loads of the throughput plot (fractions of the capacity).
    #[arg(long, num_args = 1.., default_values_t = [0.2, 0.4, 0.6, 0.8, 1.0, 1.2])]
    pub sweep: Vec<f64>,
    /// A client gives up on a request this many seconds after sending it (counted failed).
    #[arg(long, default_value_t = 60.0)]
    pub timeout_s: f64,
    /// llama.cpp's replay driver (`llama-replay.mjs` in a folder holding node-llama-cpp,
    /// as `scripts/bench-table.sh` sets up); without it the peer is left out.
    #[arg(long)]
    pub peer: Option<PathBuf>,
    /// Folder the SVG plots are written to.
    #[arg(long, default_value = "docs/bench")]
    pub plots: PathBuf,
    #[command(flatten)]
    pub sched: SchedArgs,
    #[command(flatten)]
    pub kv: KvArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// The three engines' figures at one offered load.
struct Point {
    load: f64,
    offered_tokens_per_min: f64,
    before: Figures,
    after: Figures,
    peer: Option<Figures>,
}

struct Table<'a> {
    args: &'a TableArgs,
    gguf: &'a GgufFile<'a>,
    peer: Option<Peer>,
}

impl Table<'_> {
    fn serving(&self) -> Serving<'_> {
        let a = self.args;
        Serving {
            sched: &a.sched,
            kv: &a.kv,
            mode: Mode::Continuous,
            policy: a.sched.policy,
            config: a.sched.config(),
            timeout: Some(a.timeout_s),
        }
    }

    /// Every engine on the same arrivals at `load` times `capacity` requests per second.
    fn point<B: EngineBackend>(
        &self,
        models: [&Model<B>; 2],
        turns: &[ChatTurn],
        load: f64,
        capacity: f64,
        peer_adapter: &mut Option<String>,
    ) -> Result<Point> {
        let a = self.args;
        let [reference, fast] = models;
        let rate = load * capacity;
        let jobs = with_arrivals(turns, rate, a.seed);
        eprintln!("bench table: offered load {:.0}%: after", load * 100.0);
        let after = serve_jobs(fast, &jobs, &self.serving())?;
        let peer = match &self.peer {
            Some(p) => {
                eprintln!("bench table: offered load {:.0}%: llama.cpp", load * 100.0);
                let parallel = a.sched.max_batch.min(jobs.len()).max(1);
                let w = PeerWorkload::new(&jobs, parallel, a.timeout_s, a.sched.max_batch_tokens);
                let (f, adapter) = p.replay(&jobs, &w)?;
                *peer_adapter = Some(adapter);
                Some(f)
            }
            None => None,
        };
        eprintln!("bench table: offered load {:.0}%: before", load * 100.0);
        let before = before::serve_one_at_a_time(reference, &jobs, a.timeout_s)?;
        let mean_out = jobs.iter().map(|j| j.max_tokens).sum::<usize>() as f64 / jobs.len() as f64;
        Ok(Point {
            load,
            offered_tokens_per_min: rate * mean_out * 60.0,
            before,
            after,
            peer,
        })
    }
}

/// How a row's figures are written and compared.
#[derive(Clone, Copy)]
enum Unit {
    /// A rate: higher is better, compared as a ratio.
    Rate,
    /// Seconds or bytes: lower is better, compared as a ratio.
    Lower,
    /// A percentage, compared as a difference in points.
    Percent,
}

/// Prints the table at one point, with the improvement columns.
fn print_table(p: &Point, requests: usize) {
    let engines: Vec<(&str, &Figures)> = [
        ("before", Some(&p.before)),
        ("after", Some(&p.after)),
        ("llama.cpp", p.peer.as_ref()),
    ]
    .into_iter()
    .filter_map(|(n, f)| f.map(|f| (n, f)))
    .collect();
    type Figure = fn(&Figures, usize) -> f64;
    let rows: [(&str, Figure, Unit); 7] = [
        (
            "throughput, tokens/min",
            |f, _| f.tokens_per_min(),
            Unit::Rate,
        ),
        (
            "P99 end-to-end latency, s",
            |f, _| percentile(&f.e2e, 0.99),
            Unit::Lower,
        ),
        (
            "utilisation (busy share of wall time)",
            |f, _| f.busy_fraction() * 100.0,
            Unit::Percent,
        ),
        (
            "error rate (requests not completed)",
            |f, n| f.failed as f64 / n as f64 * 100.0,
            Unit::Percent,
        ),
        ("TTFT P50, s", |f, _| percentile(&f.ttft, 0.5), Unit::Lower),
        ("TTFT P99, s", |f, _| percentile(&f.ttft, 0.99), Unit::Lower),
        (
            "peak KV memory, MB",
            |f, _| f.peak_kv_bytes as f64 / 1e6,
            Unit::Lower,
        ),
    ];
    let mut header = String::from("| |");
    for (name, _) in &engines {
        header += &format!(" {name} |");
    }
    header += " after vs before |";
    if p.peer.is_some() {
        header += " after vs llama.cpp |";
    }
    let columns = header.matches('|').count() - 1;
    println!("{header}\n{}|", "|---".repeat(columns));
    for (name, figure, unit) in rows {
        let mut line = format!("| {name} |");
        for (_, f) in &engines {
            let v = figure(f, requests);
            line += &match unit {
                Unit::Percent => format!(" {v:.1}% |"),
                _ if v >= 100.0 => format!(" {v:.0} |"),
                _ => format!(" {v:.2} |"),
            };
        }
        let after = figure(&p.after, requests);
        for (name, f) in &engines {
            if *name == "after" {
                continue;
            }
            let other = figure(f, requests);
            line += &match unit {
                Unit::Rate => format!(" {:.2}x |", after / other),
                Unit::Lower if other >= after => format!(" {:.2}x lower |", other / after),
                Unit::Lower => format!(" {:.2}x higher |", after / other),
                Unit::Percent => format!(" {:+.1} points |", after - other),
            };
        }
        println!("{line}");
    }
}

/// Prints each target of the issue with the figure and whether it is met.
fn print_targets(p: &Point) {
    let tpm = |f: &Figures| f.tokens_per_min();
    let p99 = |f: &Figures| percentile(&f.e2e, 0.99);
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let throughput = tpm(&p.after) / tpm(&p.before);
    let latency = p99(&p.before) / p99(&p.after);
    let busy = p.after.busy_fraction() * 100.0;
    println!("targets at {:.0}% load:", p.load * 100.0);
    println!(
        "- throughput after / before >= 5x: {throughput:.2}x, {}",
        verdict(throughput >= 5.0)
    );
    println!(
        "- P99 after at least 4x lower: {latency:.2}x, {}",
        verdict(latency >= 4.0)
    );
    println!(
        "- zero failed requests after: {} failed, {}",
        p.after.failed,
        verdict(p.after.failed == 0)
    );
    println!(
        "- utilisation after >= 90%: {busy:.1}%, {}",
        verdict(busy >= 90.0)
    );
    if let Some(peer) = &p.peer {
        let vs = tpm(&p.after) / tpm(peer);
        let lower = p99(&p.after) < p99(peer);
        println!(
            "- after / llama.cpp throughput above 1x with lower P99: {vs:.2}x, P99 {:.2} s vs {:.2} s, {}",
            p99(&p.after),
            p99(peer),
            verdict(vs > 1.0 && lower)
        );
    }
}

impl BackendTask for Table<'_> {
    type Output = Result<()>;

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) -> Result<()> {
        let a = self.args;
        let conversations = a.conversations.unwrap_or(match info.kind {
            BackendKind::Cuda => 128,
            BackendKind::Wgpu => 4,
            _ => 16,
        });
        anyhow::ensure!(
            conversations >= 1 && a.turns >= 1,
            "need a conversation and a turn"
        );
        let output_tokens = crate::token_range(&a.output_tokens, "--output-tokens")?;
        anyhow::ensure!(
            a.load > 0.0 && a.sweep.iter().all(|&l| l > 0.0),
            "loads are positive fractions of the capacity"
        );
        let tok = tokenizer(self.gguf)?;
        let shape = WorkloadShape {
            conversations,
            turns: a.turns,
            output_tokens,
            seed: a.seed,
        };
        let turns = chat_turns(&tok, &shape)?;
        let fast = load_model::<B>(self.gguf, &device, a.model.load_options())?;
        let reference = load_model::<B>(
            self.gguf,
            &device,
            LoadOptions {
                dequantize: true,
                reference_ops: true,
            },
        )?;

        // Capacity: the whole workload at once through "after".
        let burst: Vec<Job> = with_arrivals(&turns, f64::INFINITY, a.seed);
        let cap = serve_jobs(&fast, &burst, &self.serving())?;
        let capacity = burst.len() as f64 / cap.makespan;

        let mut loads = vec![a.load];
        loads.extend(a.sweep.iter().filter(|&&l| (l - a.load).abs() > 1e-9));
        let mut peer_adapter = None;
        let mut points = Vec::new();
        for &load in &loads {
            points.push(self.point(
                [&reference, &fast],
                &turns,
                load,
                capacity,
                &mut peer_adapter,
            )?);
        }

        let prompt_lens: Vec<f64> = turns.iter().map(|t| t.prompt.len() as f64).collect();
        println!("backend: {} | adapter: {}", info.kind, info.adapter);
        if let Some(adapter) = &peer_adapter {
            println!("peer: llama.cpp, {adapter}");
        }
        println!(
            "workload: {} customer-service chats x {} turns = {} requests (seed {}), 3 shared system prompts, prompts {:.0}..{:.0} tokens, outputs {}..={} tokens, QoS 0/1/3; client timeout {} s",
            conversations,
            a.turns,
            turns.len(),
            a.seed,
            prompt_lens.iter().copied().fold(f64::INFINITY, f64::min),
            prompt_lens.iter().copied().fold(0.0, f64::max),
            a.output_tokens[0],
            a.output_tokens[1],
            a.timeout_s
        );
        println!(
            "capacity of after (all at once): {capacity:.3} requests/s; table at {:.0}% = {:.3} requests/s, Poisson",
            a.load * 100.0,
            a.load * capacity
        );
        println!("before: one request at a time, no prefix cache, contiguous FP32 KV, FP32 weights, operation by operation");
        println!(
            "after: continuous batching (max batch {}, {} tokens per step, policy {}), prefix cache {}, paged KV ({} MiB, FP32 newest then FP16), quantized weights, fused kernels",
            a.sched.max_batch,
            a.sched.max_batch_tokens,
            a.sched.policy.name(),
            if a.sched.no_prefix_cache { "off" } else { "on" },
            a.kv.kv_memory
        );
        let table = &points[0];
        print_table(table, turns.len());
        println!("utilisation: Fornax, the share of wall time in forward passes (step timings); llama.cpp, the share with a request in flight. Peak KV: Fornax, bytes of blocks in use (after) or of the contiguous cache (before); llama.cpp, its context's allocated state.");
        print_targets(table);

        let mut by_load: Vec<&Point> = points.iter().collect();
        by_load.sort_by(|x, y| x.load.total_cmp(&y.load));
        std::fs::create_dir_all(&a.plots)
            .with_context(|| format!("cannot create {}", a.plots.display()))?;
        let cdf = |name, f: &Figures| Series {
            name,
            points: plots::cdf(&f.e2e, turns.len()),
        };
        let mut latency = vec![cdf("before", &table.before), cdf("after", &table.after)];
        if let Some(peer) = &table.peer {
            latency.push(cdf("llama.cpp", peer));
        }
        let title = format!(
            "End-to-end latency at {:.0}% load, {} requests ({})",
            table.load * 100.0,
            turns.len(),
            info.kind
        );
        let cdf_path = a.plots.join("latency-cdf.svg");
        plots::latency_cdf(&cdf_path, &title, &latency)?;

        let curve = |name, pick: &dyn Fn(&Point) -> Option<f64>| Series {
            name,
            points: by_load
                .iter()
                .filter_map(|p| pick(p).map(|v| (p.load * 100.0, v)))
                .collect(),
        };
        let mut throughput = vec![
            curve("before", &|p| Some(p.before.tokens_per_min())),
            curve("after", &|p| Some(p.after.tokens_per_min())),
        ];
        if self.peer.is_some() {
            throughput.push(curve("llama.cpp", &|p| {
                p.peer.as_ref().map(Figures::tokens_per_min)
            }));
        }
        throughput.push(curve("offered", &|p| Some(p.offered_tokens_per_min)));
        let title = format!("Throughput against offered load ({})", info.kind);
        let load_path = a.plots.join("throughput-vs-load.svg");
        plots::throughput_vs_load(&load_path, &title, &throughput)?;
        println!("| offered load | offered tokens/min | before | after | llama.cpp |");
        println!("|---|---|---|---|---|");
        for p in &by_load {
            println!(
                "| {:.0}% | {:.0} | {:.0} | {:.0} | {} |",
                p.load * 100.0,
                p.offered_tokens_per_min,
                p.before.tokens_per_min(),
                p.after.tokens_per_min(),
                p.peer
                    .as_ref()
                    .map_or("-".into(), |f| format!("{:.0}", f.tokens_per_min()))
            );
        }
        println!("plots: {} and {}", cdf_path.display(), load_path.display());
        Ok(())
    }
}

pub fn run(args: TableArgs) -> Result<()> {
    let file = args.model.open()?;
    let gguf = parse(&file)?;
    let peer = args.peer.as_ref().map(|script| -> Result<Peer> {
        Ok(Peer {
            script: script.clone(),
            model: args.model.path()?,
            threads: args.model.cpu_threads(),
        })
    });
    let peer = peer.transpose()?;
    args.model.run_on(Table {
        args: &args,
        gguf: &gguf,
        peer,
    })?
}
