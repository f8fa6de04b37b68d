//! `fornax bench prefix`: a chat workload whose requests share system prompts and their
//! own earlier turns, served with the prefix cache off and on at several batch sizes.
//!
//! Each of `B` conversations (for batch size `B`) uses one of a few system prompts and
//! runs several turns; a turn's prompt is the system prompt, every earlier user message
//! and reply, and a new user message, and the next turn is submitted as soon as the reply
//! is done. Before the clock starts, one request per system prompt warms the cache (as
//! earlier traffic would), in both modes. Time is measured as in `bench load`: the clock
//! advances by each engine step's wall time.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use fornax_backends::{BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::remote::{lookable_blocks, RemoteStats, RemoteTier};
use fornax_engine::model::Model;
use fornax_engine::sampling::SamplingParams;
use fornax_engine::sched::{PolicyKind, RequestId};
use fornax_engine::{Engine, EngineBackend, Event, Request};

use crate::load::{percentile, read_text};
use fornax_options::kv::KvArgs;
use fornax_options::sched::SchedArgs;
use fornax_options::{load_model, parse, ModelArgs};

#[derive(Args, Debug)]
pub struct PrefixArgs {
    /// Batch sizes: conversations served at once (and the engine's maximum batch).
    #[arg(long, num_args = 1.., default_values_t = [8, 32, 64, 128])]
    pub batch_sizes: Vec<usize>,
    /// Distinct system prompts the conversations share.
    #[arg(long, default_value_t = 4)]
    pub system_prompts: usize,
    /// Tokens per system prompt.
    #[arg(long, default_value_t = 128)]
    pub system_tokens: usize,
    /// Turns per conversation.
    #[arg(long, default_value_t = 3)]
    pub turns: usize,
    /// Tokens per user message.
    #[arg(long, default_value_t = 16)]
    pub user_tokens: usize,
    /// Tokens per reply.
    #[arg(long, default_value_t = 12)]
    pub output_tokens: usize,
    /// Text the prompts are cut from.
    #[arg(long, default_value = "tests/reference/ppl_text.txt")]
    pub text: std::path::PathBuf,
    /// Serve only with the prefix cache on (its hit rate and evictions, no comparison).
    #[arg(long)]
    pub cache_on_only: bool,
    /// 2: replica A serves the workload, writing its blocks to the shared tier
    /// (`--kv-remote`), then replica B, which has seen nothing, serves it with the shared
    /// tier off and on.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub replicas: u8,
    #[command(flatten)]
    pub sched: SchedArgs,
    #[command(flatten)]
    pub kv: KvArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// Figures of one run.
#[derive(Debug, Default)]
struct Figures {
    ttft: Vec<f64>,
    /// Time to first token of each conversation's first turn: the prompts (a system
    /// prompt and a first message) a replica that has seen nothing holds none of.
    ttft_first: Vec<f64>,
    generated: usize,
    makespan: f64,
    /// Blocks in use (referenced), sampled after every step.
    blocks: Vec<usize>,
    hit_rate: Option<f64>,
    /// Cached blocks evicted, and indexed blocks that aged into FP16 (both lost to reuse).
    evicted: u64,
    aged_out: u64,
    prompt_tokens: usize,
    computed: u64,
    preemptions: u64,
    /// Blocks brought from the shared tier.
    remote_blocks: u64,
}

/// How one run is served.
#[derive(Clone, Copy)]
struct Run<'r> {
    batch: usize,
    cache: bool,
    /// The shared tier (replicas), if on.
    remote: Option<&'r RemoteTier>,
    /// Whether each system prompt is served once before the clock starts.
    warm: bool,
}

/// One conversation in progress.
struct Conversation {
    history: Vec<u32>,
    turn: usize,
    reply: Vec<u32>,
    submitted: f64,
    first_token: bool,
}

struct PrefixBench<'a> {
    args: &'a PrefixArgs,
    gguf: &'a GgufFile<'a>,
}

impl PrefixBench<'_> {
    /// A slice of the text, different for every `(conversation, turn)`.
    fn user_message<'t>(&self, text: &'t [u32], conversation: usize, turn: usize) -> &'t [u32] {
        let a = self.args;
        let n = a.user_tokens;
        let slots = (text.len() - n) / n;
        let at = (1 + conversation * a.turns + turn) % slots;
        &text[at * n..at * n + n]
    }

    fn serve<B: EngineBackend>(
        &self,
        model: &Model<B>,
        text: &[u32],
        systems: &[Vec<u32>],
        run: Run<'_>,
    ) -> Result<Figures> {
        let a = self.args;
        let Run {
            batch,
            cache,
            remote,
            warm,
        } = run;
        let mut config = a.sched.config();
        config.max_batch = batch;
        let capacity = a.kv.capacity(model.kv_dims(), batch, 256)?;
        let kv = match cache {
            true => a.kv.paged(model, capacity, true)?,
            false => model.new_paged_cache(capacity, a.kv.policy()),
        };
        let mut engine = a
            .sched
            .spec
            .apply(Engine::new(model, kv, config, PolicyKind::Fcfs));
        if cache {
            engine = engine.with_prefix_cache();
        }
        if remote.is_some() {
            engine.kv.pool.enable_publishing();
        }
        let request = |prompt: Vec<u32>, max_tokens| Request {
            prompt,
            max_tokens,
            qos: 0,
            sampling: SamplingParams::greedy(),
            stop_ids: vec![],
            constraint: None,
            logprobs: None,
            prompt_logprobs: None,
        };
        // Warm-up: each system prompt once, outside the figures (a replica that has seen
        // nothing skips it).
        if warm {
            for s in systems {
                let mut prompt = s.clone();
                prompt.push(text[0]);
                engine.submit(request(prompt, 1))?;
            }
        }
        while !engine.is_idle() {
            engine.step()?;
        }
        let warm_stats = engine.kv.pool.prefix_stats().unwrap_or_default();
        let warm_computed = engine.tokens_computed;

        let mut f = Figures::default();
        let mut now = 0.0f64;
        let mut live: HashMap<RequestId, usize> = HashMap::new();
        let mut convs: Vec<Conversation> = (0..batch)
            .map(|c| Conversation {
                history: systems[c % systems.len()].clone(),
                turn: 0,
                reply: Vec::new(),
                submitted: 0.0,
                first_token: false,
            })
            .collect();
        // Queues conversation `c`'s next turn; returns the seconds spent on the shared tier.
        let submit = |engine: &mut Engine<'_, B>,
                      live: &mut HashMap<RequestId, usize>,
                      c: usize,
                      conv: &mut Conversation,
                      now: f64,
                      f: &mut Figures|
         -> Result<f64> {
            conv.history
                .extend_from_slice(self.user_message(text, c, conv.turn));
            conv.submitted = now;
            conv.first_token = false;
            conv.reply.clear();
            f.prompt_tokens += conv.history.len();
            let mut spent = 0.0;
            if let Some(tier) = remote {
                // What this replica does not hold is asked of the shared tier first (the
                // server does it off the engine's thread; here its time is counted).
                let t = Instant::now();
                let held = engine.kv.pool.held_blocks(&conv.history);
                if held < lookable_blocks(&conv.history) {
                    let blocks = tier.lookup(&conv.history, held);
                    f.remote_blocks += engine.import_prefix(&conv.history, held, blocks) as u64;
                }
                spent = t.elapsed().as_secs_f64();
            }
            let id = engine.submit(request(conv.history.clone(), a.output_tokens))?;
            live.insert(id, c);
            Ok(spent)
        };
        for (c, conv) in convs.iter_mut().enumerate() {
            now += submit(&mut engine, &mut live, c, conv, now, &mut f)?;
        }
        while !engine.is_idle() {
            let t = Instant::now();
            let events = engine.step()?;
            now += t.elapsed().as_secs_f64();
            if let Some(tier) = remote {
                for (tokens, values) in engine.kv.take_published() {
                    tier.publish(tokens, values);
                }
            }
            f.blocks.push(engine.kv_stats().blocks_used);
            for e in events {
                match e {
                    Event::Token { id, token, .. } => {
                        let conv = &mut convs[live[&id]];
                        f.generated += 1;
                        conv.reply.push(token);
                        if !conv.first_token {
                            conv.first_token = true;
                            f.ttft.push(now - conv.submitted);
                            if conv.turn == 0 {
                                f.ttft_first.push(now - conv.submitted);
                            }
                        }
                    }
                    Event::PromptLogprobs { .. } => {}
                    Event::Finished { id, .. } => {
                        let c = live.remove(&id).expect("live");
                        let conv = &mut convs[c];
                        let reply = std::mem::take(&mut conv.reply);
                        conv.history.extend(reply);
                        conv.turn += 1;
                        if conv.turn < a.turns {
                            now += submit(&mut engine, &mut live, c, conv, now, &mut f)?;
                        }
                    }
                }
            }
        }
        f.makespan = now;
        f.computed = engine.tokens_computed - warm_computed;
        f.preemptions = engine.sched.preemptions;
        if let Some(s) = engine.kv.pool.prefix_stats() {
            let hits = s.hit_tokens - warm_stats.hit_tokens;
            let looked = s.lookup_tokens - warm_stats.lookup_tokens;
            f.hit_rate = Some(hits as f64 / looked.max(1) as f64);
            f.evicted = s.evictions - warm_stats.evictions;
            f.aged_out = s.aged_out - warm_stats.aged_out;
        }
        Ok(f)
    }
}

impl PrefixBench<'_> {
    /// Two replicas sharing a Redis: A serves each batch size's workload first (warmed as
    /// usual), then B, which has seen nothing, with the shared tier off and on.
    fn replicas<B: EngineBackend>(
        &self,
        model: &Model<B>,
        text: &[u32],
        systems: &[Vec<u32>],
    ) -> Result<()> {
        let a = self.args;
        let tier =
            a.kv.remote(&a.model.path()?, model.kv_dims())?
                .context("--replicas 2 needs --kv-remote redis://HOST:PORT")?;
        println!("| batch | replica | TTFT P50 s | TTFT P99 s | first turns: TTFT P50 s | P99 s | tokens/min | blocks from the shared tier | tokens computed, of all fed |");
        println!("|---|---|---|---|---|---|---|---|---|");
        for &batch in &a.batch_sizes {
            let runs = [
                ("A, fills the shared tier", Some(&*tier), true),
                ("B, shared tier off", None, false),
                ("B, shared tier on", Some(&*tier), false),
            ];
            let mut rows = Vec::new();
            for (name, remote, warm) in runs {
                let run = Run {
                    batch,
                    cache: true,
                    remote,
                    warm,
                };
                let f = self.serve(model, text, systems, run)?;
                if warm {
                    tier.flush(std::time::Duration::from_secs(120));
                }
                println!(
                    "| {batch} | {name} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} | {} | {} of {} |",
                    percentile(&f.ttft, 0.5),
                    percentile(&f.ttft, 0.99),
                    percentile(&f.ttft_first, 0.5),
                    percentile(&f.ttft_first, 0.99),
                    f.generated as f64 / f.makespan * 60.0,
                    f.remote_blocks,
                    f.computed,
                    f.prompt_tokens + f.generated,
                );
                rows.push(f);
            }
            let (off, on) = (&rows[1], &rows[2]);
            let tpm = |f: &Figures| f.generated as f64 / f.makespan;
            let lower = |q: f64, pick: fn(&Figures) -> &Vec<f64>| {
                percentile(pick(off), q) / percentile(pick(on), q)
            };
            println!(
                "| {batch} | B, on vs off | {:.2}x lower | {:.2}x lower | {:.2}x lower | {:.2}x lower | {:.2}x | | |",
                lower(0.5, |f| &f.ttft),
                lower(0.99, |f| &f.ttft),
                lower(0.5, |f| &f.ttft_first),
                lower(0.99, |f| &f.ttft_first),
                tpm(on) / tpm(off),
            );
            let first = lower(0.5, |f| &f.ttft_first).min(lower(0.99, |f| &f.ttft_first));
            println!(
                "| {batch} | target: first-turn TTFT (prompts only A had seen) at least 3x lower, P50 and P99 | {} | | | | | | |",
                if first >= 3.0 { "met" } else { "MISSED" }
            );
        }
        let s = &tier.stats;
        let get = RemoteStats::get;
        println!(
            "shared tier: {} blocks written ({:.1} MB), {} found ({:.1} MB read), {} rejected, {} errors",
            get(&s.written_blocks),
            get(&s.bytes_written) as f64 / 1e6,
            get(&s.hit_blocks),
            get(&s.bytes_read) as f64 / 1e6,
            get(&s.rejected),
            get(&s.errors)
        );
        Ok(())
    }
}

impl BackendTask for PrefixBench<'_> {
    type Output = Result<()>;

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) -> Result<()> {
        let a = self.args;
        anyhow::ensure!(
            a.system_prompts >= 1 && a.turns >= 1,
            "need a system prompt and a turn"
        );
        let model = load_model::<B>(self.gguf, &device, a.model.load_options())?;
        let text = read_text(&a.text, self.gguf)?;
        anyhow::ensure!(
            text.len() > a.system_tokens * a.system_prompts + 2 * a.user_tokens,
            "the text is too short"
        );
        // System prompts from the end of the text; user messages from the start.
        let systems: Vec<Vec<u32>> = (0..a.system_prompts)
            .map(|s| {
                let end = text.len() - s * a.system_tokens;
                text[end - a.system_tokens..end].to_vec()
            })
            .collect();
        let user_text = &text[..text.len() - a.system_tokens * a.system_prompts];
        println!(
            "backend: {} | adapter: {} | dtype: {}",
            info.kind, info.adapter, info.dtype
        );
        println!(
            "workload: per batch size B, B conversations over {} system prompts of {} tokens, {} turns of {} user tokens and {} reply tokens; KV pool {} MiB",
            a.system_prompts, a.system_tokens, a.turns, a.user_tokens, a.output_tokens, a.kv.kv_memory
        );
        println!("| batch | prefix cache | TTFT P50 s | TTFT P99 s | tokens/min | KV blocks in use, mean / peak | hit rate | cached blocks evicted / aged into FP16 | tokens computed, of all fed | preemptions |");
        println!("|---|---|---|---|---|---|---|---|---|---|");
        if a.replicas == 2 {
            return self.replicas(&model, user_text, &systems);
        }
        for &batch in &a.batch_sizes {
            let mut rows = Vec::new();
            let modes: &[bool] = if a.cache_on_only {
                &[true]
            } else {
                &[false, true]
            };
            for &cache in modes {
                let run = Run {
                    batch,
                    cache,
                    remote: None,
                    warm: true,
                };
                let f = self.serve(&model, user_text, &systems, run)?;
                let mean = f.blocks.iter().sum::<usize>() as f64 / f.blocks.len().max(1) as f64;
                let peak = f.blocks.iter().copied().max().unwrap_or(0);
                println!(
                    "| {batch} | {} | {:.2} | {:.2} | {:.0} | {mean:.0} / {peak} | {} | {} / {} | {} of {} | {} |",
                    if cache { "on" } else { "off" },
                    percentile(&f.ttft, 0.5),
                    percentile(&f.ttft, 0.99),
                    f.generated as f64 / f.makespan * 60.0,
                    f.hit_rate.map_or("-".into(), |r| format!("{:.1}%", r * 100.0)),
                    f.evicted,
                    f.aged_out,
                    f.computed,
                    f.prompt_tokens + f.generated,
                    f.preemptions
                );
                rows.push((f, mean, peak));
            }
            let [off, on] = &rows[..] else { continue };
            let tpm = |f: &Figures| f.generated as f64 / f.makespan;
            println!(
                "| {batch} | on vs off | {:.2}x lower | {:.2}x lower | {:.2}x | {:.0}% / {:.0}% fewer | | | | |",
                percentile(&off.0.ttft, 0.5) / percentile(&on.0.ttft, 0.5),
                percentile(&off.0.ttft, 0.99) / percentile(&on.0.ttft, 0.99),
                tpm(&on.0) / tpm(&off.0),
                (1.0 - on.1 / off.1) * 100.0,
                (1.0 - on.2 as f64 / off.2 as f64) * 100.0,
            );
        }
        Ok(())
    }
}

pub fn run(args: PrefixArgs) -> Result<()> {
    let file = args.model.open()?;
    let gguf = parse(&file).context("model")?;
    args.model.run_on(PrefixBench {
        args: &args,
        gguf: &gguf,
    })?
}
