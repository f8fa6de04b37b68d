//! `fornax bench load`: a seeded open-loop load (Poisson arrivals, mixed prompt and output
//! lengths, mixed QoS) at a fraction of the measured capacity, served three ways in one
//! process: one request at a time, static batches gathered in a time window, and
//! continuous batching.
//!
//! Time is virtual but measured: the clock advances by the wall time of each engine step,
//! and jumps over idle gaps to the next arrival instead of sleeping, so a run takes only
//! the compute it needs while arrivals, waits and latencies are those of a real-time run.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use fornax_backends::{BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{HostStats, KvStats};
use fornax_engine::model::Model;
use fornax_engine::sampling::SamplingParams;
use fornax_engine::sched::{PolicyKind, RequestId, SchedulerConfig};
use fornax_engine::{EngineBackend, Event, Request};
use rand::{rngs::StdRng, Rng, SeedableRng};

use fornax_options::kv::KvArgs;
use fornax_options::sched::SchedArgs;
use fornax_options::{load_model, parse, ModelArgs};

#[derive(Args, Debug)]
pub struct LoadArgs {
    /// Requests in the load.
    #[arg(long, default_value_t = 32)]
    pub requests: usize,
    /// Offered load as a fraction of the measured continuous-batching capacity.
    #[arg(long, default_value_t = 0.8)]
    pub load: f64,
    /// Prompt length range in tokens (inclusive).
    #[arg(long, num_args = 2, default_values_t = [16, 96])]
    pub prompt_tokens: Vec<usize>,
    /// Output length range in tokens (inclusive).
    #[arg(long, num_args = 2, default_values_t = [8, 40])]
    pub output_tokens: Vec<usize>,
    /// Seed of the workload.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Text the prompts are cut from.
    #[arg(long, default_value = "tests/reference/ppl_text.txt")]
    pub text: std::path::PathBuf,
    #[command(flatten)]
    pub sched: SchedArgs,
    #[command(flatten)]
    pub kv: KvArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// One request of the workload.
#[derive(Debug, Clone)]
pub(super) struct Job {
    /// Seconds from the start of the load.
    pub arrival: f64,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub qos: u8,
}

/// How requests are admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// One request at a time, in arrival order.
    Single,
    /// Batches gathered for the window, run to completion before the next is admitted.
    Static,
    /// Requests join at the next step; an idle engine waits the window to gather.
    Continuous,
}

impl Mode {
    pub(super) fn name(self) -> &'static str {
        match self {
            Mode::Single => "(a) one at a time",
            Mode::Static => "(b) static batches, time window",
            Mode::Continuous => "(c) continuous batching",
        }
    }
}

/// Figures of one run.
#[derive(Debug, Default)]
pub(super) struct Figures {
    /// Tokens generated for requests that completed.
    pub generated: usize,
    pub makespan: f64,
    /// Seconds spent in forward passes.
    pub busy: f64,
    pub ttft: Vec<f64>,
    /// Time to first token per QoS class.
    pub ttft_by_qos: [Vec<f64>; 4],
    /// End-to-end latency of each completed request.
    pub e2e: Vec<f64>,
    /// Requests that did not complete: refused, given up after the timeout, or failed.
    pub failed: usize,
    /// Peak bytes of KV cache in use.
    pub peak_kv_bytes: usize,
    pub preemptions: u64,
    /// Tokens run through the model (recomputation after preemption included).
    pub computed: u64,
    /// Tokens preempted requests computed again.
    pub recomputed: u64,
    /// The pool's figures at the end (elastic-window trims among them).
    pub kv: KvStats,
    /// The host tier's figures at the end, when it is on.
    pub host: Option<HostStats>,
    /// The tokens each job received, in job order (greedy: runs can be compared).
    pub outputs: Vec<Vec<u32>>,
}

impl Figures {
    /// Generated tokens per minute.
    pub fn tokens_per_min(&self) -> f64 {
        self.generated as f64 / self.makespan * 60.0
    }

    /// The fraction of the run spent in forward passes.
    pub fn busy_fraction(&self) -> f64 {
        self.busy / self.makespan
    }
}

/// The time to the next arrival of a Poisson process of `rate` per second (an exponential
/// gap).
pub(super) fn poisson_gap(rng: &mut impl Rng, rate: f64) -> f64 {
    -(1.0 - rng.random::<f64>()).ln() / rate
}

/// The `p` quantile (0..1) of `v`; NaN when empty.
pub(super) fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

pub(super) struct LoadBench<'a> {
    pub args: &'a LoadArgs,
    pub gguf: &'a GgufFile<'a>,
}

impl LoadBench<'_> {
    /// The workload with arrival times for `rate` requests per second.
    pub(super) fn jobs(&self, text: &[u32], rate: f64) -> Vec<Job> {
        let a = self.args;
        let mut rng = StdRng::seed_from_u64(a.seed);
        let mut t = 0.0;
        (0..a.requests)
            .map(|_| {
                let len = rng.random_range(a.prompt_tokens[0]..=a.prompt_tokens[1]);
                let start = rng.random_range(0..text.len() - len);
                let job = Job {
                    arrival: t,
                    prompt: text[start..start + len].to_vec(),
                    max_tokens: rng.random_range(a.output_tokens[0]..=a.output_tokens[1]),
                    qos: rng.random_range(0..4),
                };
                // Exponential gaps: a Poisson process.
                t += poisson_gap(&mut rng, rate);
                job
            })
            .collect()
    }

    /// The workload arriving all at once.
    pub(super) fn burst(&self, text: &[u32]) -> Vec<Job> {
        self.jobs(text, 1.0)
            .into_iter()
            .map(|j| Job { arrival: 0.0, ..j })
            .collect()
    }

    /// Serves `jobs` in `mode` on a fresh engine.
    pub(super) fn serve<B: EngineBackend>(
        &self,
        model: &Model<B>,
        jobs: &[Job],
        mode: Mode,
        policy: PolicyKind,
    ) -> Result<Figures> {
        self.serve_with(model, jobs, mode, policy, self.args.sched.config())
    }

    /// [`Self::serve`] with scheduler settings `config`.
    pub(super) fn serve_with<B: EngineBackend>(
        &self,
        model: &Model<B>,
        jobs: &[Job],
        mode: Mode,
        policy: PolicyKind,
        config: SchedulerConfig,
    ) -> Result<Figures> {
        let serving = Serving {
            sched: &self.args.sched,
            kv: &self.args.kv,
            mode,
            policy,
            config,
            timeout: None,
        };
        serve_jobs(model, jobs, &serving)
    }
}

/// How a workload is served by the engine.
pub(super) struct Serving<'a> {
    pub sched: &'a SchedArgs,
    pub kv: &'a KvArgs,
    pub mode: Mode,
    pub policy: PolicyKind,
    pub config: SchedulerConfig,
    /// Seconds after its arrival at which a request is given up (a client's timeout).
    pub timeout: Option<f64>,
}

/// Serves `jobs` on a fresh engine, with time measured as the module's doc says.
pub(super) fn serve_jobs<B: EngineBackend>(
    model: &Model<B>,
    jobs: &[Job],
    s: &Serving<'_>,
) -> Result<Figures> {
    let mut config = s.config;
    if s.mode == Mode::Single {
        config.max_batch = 1;
    }
    let policy = match s.mode {
        Mode::Continuous => s.policy,
        _ => PolicyKind::Fcfs,
    };
    let mode = s.mode;
    let capacity = s.kv.capacity(model.kv_dims(), config.max_batch, 256)?;
    let kv = s.kv.paged(model, capacity, !s.sched.no_prefix_cache)?;
    let mut engine = s.sched.engine_with(model, kv, config, policy);
    let window = s.sched.window_s();
    let timeout = s.timeout.unwrap_or(f64::INFINITY);
    let mut f = Figures {
        outputs: vec![Vec::new(); jobs.len()],
        ..Figures::default()
    };
    let mut now = 0.0f64;
    let mut next = 0;
    // Each request in flight: its job, and the tokens it has received.
    let mut live: HashMap<RequestId, (usize, usize)> = HashMap::new();
    let start = jobs.first().map_or(0.0, |j| j.arrival);
    while next < jobs.len() || !engine.is_idle() {
        // Requests still queued past their timeout are given up by their clients.
        while next < jobs.len() && now - jobs[next].arrival > timeout {
            f.failed += 1;
            next += 1;
        }
        // Admission.
        let idle = engine.is_idle();
        let arrived = jobs[next..].iter().take_while(|j| j.arrival <= now).count();
        let admit = match mode {
            Mode::Single | Mode::Static if !idle => 0,
            Mode::Single => arrived.min(1),
            Mode::Static | Mode::Continuous if idle => {
                let gathered = arrived > 0 && now >= jobs[next].arrival + window;
                let full = arrived >= config.max_batch;
                if gathered || full {
                    arrived.min(config.max_batch)
                } else {
                    0
                }
            }
            Mode::Static | Mode::Continuous => arrived,
        };
        for j in &jobs[next..next + admit] {
            let req = Request {
                prompt: j.prompt.clone(),
                max_tokens: j.max_tokens,
                qos: j.qos,
                sampling: SamplingParams::greedy(),
                stop_ids: vec![],
                constraint: None,
                logprobs: None,
                prompt_logprobs: None,
            };
            match engine.submit(req) {
                Ok(id) => {
                    live.insert(id, (next, 0));
                }
                Err(_) => f.failed += 1,
            }
            next += 1;
        }
        if engine.is_idle() {
            // Nothing to run: jump to when the next admission happens (the window
            // closes, or enough requests arrived to fill a batch).
            if next < jobs.len() {
                let mut at = jobs[next].arrival;
                if mode != Mode::Single {
                    at += window;
                    if let Some(j) = jobs.get(next + config.max_batch - 1) {
                        at = at.min(j.arrival);
                    }
                }
                now = now.max(at);
            }
            continue;
        }
        let t = Instant::now();
        let events = match engine.step() {
            Ok(e) => e,
            Err(e) => {
                eprintln!("step failed: {e}");
                f.failed += engine.sched.len();
                break;
            }
        };
        let dt = t.elapsed().as_secs_f64();
        now += dt;
        f.busy += dt;
        f.peak_kv_bytes = f
            .peak_kv_bytes
            .max(engine.kv_stats().bytes_used(model.kv_dims()));
        for e in events {
            match e {
                Event::Token { id, token, .. } => {
                    let (j, received) = live.get_mut(&id).expect("live request");
                    *received += 1;
                    f.outputs[*j].push(token);
                    if *received == 1 {
                        let ttft = now - jobs[*j].arrival;
                        f.ttft.push(ttft);
                        f.ttft_by_qos[jobs[*j].qos as usize].push(ttft);
                    }
                }
                Event::PromptLogprobs { .. } => {}
                Event::Finished { id, .. } => {
                    let (j, received) = live.remove(&id).expect("live request");
                    f.e2e.push(now - jobs[j].arrival);
                    f.generated += received;
                }
            }
        }
        // Requests in flight past their timeout: the client hangs up, the engine cancels.
        let expired: Vec<RequestId> = live
            .iter()
            .filter(|(_, &(j, _))| now - jobs[j].arrival > timeout)
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            engine.cancel(id);
            live.remove(&id);
            f.failed += 1;
        }
    }
    f.makespan = now - start;
    f.preemptions = engine.sched.preemptions;
    f.computed = engine.tokens_computed;
    f.recomputed = engine.sched.recomputed;
    f.kv = engine.kv_stats();
    f.host = engine.kv.pool.host_stats();
    Ok(f)
}

impl BackendTask for LoadBench<'_> {
    type Output = Result<()>;

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) -> Result<()> {
        let a = self.args;
        crate::token_range(&a.prompt_tokens, "--prompt-tokens")?;
        crate::token_range(&a.output_tokens, "--output-tokens")?;
        let model = load_model::<B>(self.gguf, &device, a.model.load_options())?;
        let text = read_text(&a.text, self.gguf)?;
        anyhow::ensure!(text.len() > a.prompt_tokens[1], "the text is too short");

        // Capacity: the whole workload at once through continuous batching.
        let burst = self.burst(&text);
        let cap = self.serve(&model, &burst, Mode::Continuous, a.sched.policy)?;
        let capacity = burst.len() as f64 / cap.makespan;
        let rate = a.load * capacity;
        let jobs = self.jobs(&text, rate);
        println!("backend: {} | adapter: {}", info.kind, info.adapter);
        println!(
            "workload: {} requests (seed {}), prompts {}..={} tokens, outputs {}..={} tokens, QoS 0..3",
            a.requests, a.seed, a.prompt_tokens[0], a.prompt_tokens[1], a.output_tokens[0], a.output_tokens[1]
        );
        println!(
            "capacity (all at once, continuous): {capacity:.3} requests/s; offered {:.0}%: {rate:.3} requests/s (Poisson)",
            a.load * 100.0
        );
        println!(
            "batch window {} ms, max batch {}, max batch tokens {}, policy {}",
            a.sched.batch_window_ms,
            a.sched.max_batch,
            a.sched.max_batch_tokens,
            a.sched.policy.name()
        );
        println!("| mode | tokens/min | TTFT P50 s | TTFT P99 s | end-to-end P50 s | P99 s | device busy | failed | preemptions |");
        println!("|---|---|---|---|---|---|---|---|---|");
        let mut rows = Vec::new();
        for mode in [Mode::Single, Mode::Static, Mode::Continuous] {
            let f = self.serve(&model, &jobs, mode, a.sched.policy)?;
            println!(
                "| {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0}% | {} | {} |",
                mode.name(),
                f.tokens_per_min(),
                percentile(&f.ttft, 0.5),
                percentile(&f.ttft, 0.99),
                percentile(&f.e2e, 0.5),
                percentile(&f.e2e, 0.99),
                f.busy_fraction() * 100.0,
                f.failed,
                f.preemptions
            );
            rows.push(f);
        }
        let tpm = |f: &Figures| f.generated as f64 / f.makespan;
        println!(
            "continuous vs one at a time: throughput {:.2}x, end-to-end P99 {:.2}x lower; vs static: throughput {:.2}x",
            tpm(&rows[2]) / tpm(&rows[0]),
            percentile(&rows[0].e2e, 0.99) / percentile(&rows[2].e2e, 0.99),
            tpm(&rows[2]) / tpm(&rows[1]),
        );
        // The policies side by side under continuous batching, on the same arrivals.
        println!("| continuous, policy | tokens/min | TTFT P99 s, QoS 0 | QoS 1 | QoS 2 | QoS 3 | end-to-end P99 s |");
        println!("|---|---|---|---|---|---|---|");
        for policy in [PolicyKind::QosAging, PolicyKind::Fcfs, PolicyKind::Seed] {
            let f = self.serve(&model, &jobs, Mode::Continuous, policy)?;
            let q = |c: usize| percentile(&f.ttft_by_qos[c], 0.99);
            println!(
                "| {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                policy.name(),
                f.tokens_per_min(),
                q(0),
                q(1),
                q(2),
                q(3),
                percentile(&f.e2e, 0.99)
            );
        }
        Ok(())
    }
}

/// The token ids of a text file under the model's tokenizer.
pub(super) fn read_text(path: &std::path::Path, gguf: &GgufFile<'_>) -> Result<Vec<u32>> {
    let tok = fornax_options::tokenizer(gguf)?;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(tok.encode(&text, false)?)
}

pub fn run(args: LoadArgs) -> Result<()> {
    let file = args.model.open()?;
    let gguf = parse(&file)?;
    args.model.run_on(LoadBench {
        args: &args,
        gguf: &gguf,
    })?
}
