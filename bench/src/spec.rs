//! `fornax bench spec`: speculative decoding off, with prompt lookup (n-gram) and with the
//! self-draft, side by side in one run, on repetitive text (a list, a schedule, code, a
//! chat that quotes its prompt) and on free text. Each case is one greedy request through the
//! engine; the three settings' engines take their steps in turn, each step timed alone.

use std::time::Instant;

use anyhow::{ensure, Result};
use clap::Args;
use fornax_backends::{BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{KvCapacity, TierPolicy};
use fornax_engine::model::Model;
use fornax_engine::sampling::SamplingParams;
use fornax_engine::sched::{PolicyKind, SchedulerConfig};
use fornax_engine::spec::{ProposerKind, SpecConfig};
use fornax_engine::tokenizer::{ChatMessage, Tokenizer};
use fornax_engine::{Engine, EngineBackend, Event, Request};

use fornax_options::{load_model, parse, tokenizer, ModelArgs};

#[derive(Args, Debug)]
pub struct SpecBenchArgs {
    /// Tokens generated per case at most (a case ends earlier at end of sequence).
    #[arg(long, default_value_t = 96)]
    pub gen_tokens: usize,
    /// Measured runs (after one warm-up run); the settings take turns step by step.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Tokens drafted per step at most.
    #[arg(long, default_value_t = 3)]
    pub spec_tokens: usize,
    /// Layers of the self-draft.
    #[arg(long, default_value_t = 8)]
    pub spec_draft_layers: usize,
    /// Copies of each case decoded together in one batch (speculation inside a batch).
    #[arg(long, default_value_t = 1)]
    pub sequences: usize,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// A prompt, raw or as a user message through the chat template.
struct Case {
    name: &'static str,
    repetitive: bool,
    chat: bool,
    text: &'static str,
}

const CASES: &[Case] = &[
    Case {
        name: "list",
        repetitive: true,
        chat: false,
        text: "Count from 1 to 100, separated by commas: 1, 2, 3, 4,",
    },
    Case {
        name: "schedule",
        repetitive: true,
        chat: false,
        text: "Monday: open 9:00-17:00, closed for lunch 12:00-13:00\n\
               Tuesday: open 9:00-17:00, closed for lunch 12:00-13:00\nWednesday:",
    },
    Case {
        name: "code",
        repetitive: true,
        chat: true,
        text: "Add a docstring to this Python function and print the whole function:\n\n\
               def area(width, height):\n    if width < 0 or height < 0:\n        \
               raise ValueError(\"negative size\")\n    return width * height\n",
    },
    Case {
        name: "quote",
        repetitive: true,
        chat: true,
        text: "Fix the typos in this text and print it: The libary opens at nine in the \
               morning and closes at six in the evening. Members may borow up to five books \
               at a time for three weeks.",
    },
    Case {
        name: "story",
        repetitive: false,
        chat: true,
        text: "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    },
    Case {
        name: "explain",
        repetitive: false,
        chat: true,
        text: "Explain why the sky is blue to a ten-year-old.",
    },
    Case {
        name: "essay",
        repetitive: false,
        chat: false,
        text: "The history of the printing press begins",
    },
];

/// The settings compared: off, then each proposer.
const SETTINGS: [Option<ProposerKind>; 3] = [
    None,
    Some(ProposerKind::Ngram),
    Some(ProposerKind::SelfDraft),
];

fn setting_name(s: Option<ProposerKind>) -> &'static str {
    match s {
        None => "off",
        Some(ProposerKind::Ngram) => "n-gram",
        Some(ProposerKind::SelfDraft) => "self-draft",
    }
}

/// One request's figures.
#[derive(Debug, Clone, Default)]
struct Run {
    tokens: Vec<u32>,
    /// Seconds each step took, in order.
    step_s: Vec<f64>,
    /// The step that brought the first token.
    first_step: usize,
    /// The step that brought the 32nd token (the last, if fewer).
    step_32nd: usize,
    proposed: u64,
    accepted: u64,
}

impl Run {
    /// Forward passes after the first token.
    fn decode_steps(&self) -> usize {
        self.step_s.len() - 1 - self.first_step
    }

    /// Seconds from the first token to the last.
    fn decode_s(&self) -> f64 {
        self.step_s[self.first_step + 1..].iter().sum()
    }

    /// Seconds from submission to the 32nd token.
    fn to_32nd_s(&self) -> f64 {
        self.step_s[..=self.step_32nd].iter().sum()
    }

    /// The first of `runs` (the same request, the same steps) with each step's best time.
    fn best_steps(runs: &[Run]) -> Result<Run> {
        let mut best = runs[0].clone();
        for r in &runs[1..] {
            ensure!(
                r.tokens == best.tokens && r.step_s.len() == best.step_s.len(),
                "a run took different steps"
            );
            for (b, &t) in best.step_s.iter_mut().zip(&r.step_s) {
                *b = b.min(t);
            }
        }
        Ok(best)
    }
}

struct SpecBench<'a> {
    args: &'a SpecBenchArgs,
    gguf: &'a GgufFile<'a>,
    tok: &'a Tokenizer,
}

impl SpecBench<'_> {
    fn prompt(&self, case: &Case) -> Result<Vec<u32>> {
        Ok(match case.chat {
            true => self
                .tok
                .encode_chat(&[ChatMessage::new("user", case.text)])?,
            false => self.tok.encode(case.text, false)?,
        })
    }

    /// One engine per setting on the same prompt, stepped in turn (one step of each, then
    /// the next round), each step timed alone: a slow patch of a shared machine lands on
    /// every setting alike instead of on whichever ran through it.
    fn run_case<B: EngineBackend>(
        &self,
        model: &Model<B>,
        prompt: &[u32],
    ) -> Result<[Run; SETTINGS.len()]> {
        let a = self.args;
        let blocks = a.sequences * ((prompt.len() + a.gen_tokens + a.spec_tokens).div_ceil(32) + 2);
        let config = SchedulerConfig {
            max_batch: a.sequences,
            ..SchedulerConfig::default()
        };
        let mut engines = Vec::new();
        // Each engine's first request: the copies decode the same tokens.
        let mut firsts = Vec::new();
        for setting in SETTINGS {
            let kv = model.new_paged_cache(KvCapacity::f32_only(blocks), TierPolicy::ALL_F32);
            let mut engine = Engine::new(model, kv, config, PolicyKind::Fcfs);
            if let Some(proposer) = setting {
                engine = engine.with_speculation(SpecConfig {
                    proposer,
                    tokens: a.spec_tokens,
                    draft_layers: a.spec_draft_layers,
                });
            }
            let ids = (0..a.sequences)
                .map(|_| {
                    engine.submit(Request {
                        prompt: prompt.to_vec(),
                        max_tokens: a.gen_tokens,
                        qos: 0,
                        sampling: SamplingParams::greedy(),
                        stop_ids: self.tok.stop_ids(),
                        constraint: None,
                        logprobs: None,
                        prompt_logprobs: None,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            firsts.push(ids[0]);
            engines.push(engine);
        }
        let mut runs: [Run; SETTINGS.len()] = Default::default();
        while engines.iter().any(|e| !e.is_idle()) {
            for ((engine, run), &first) in engines.iter_mut().zip(runs.iter_mut()).zip(&firsts) {
                if engine.is_idle() {
                    continue;
                }
                let t = Instant::now();
                let events = engine.step()?;
                run.step_s.push(t.elapsed().as_secs_f64());
                let step = run.step_s.len() - 1;
                let had = run.tokens.len();
                run.tokens
                    .extend(events.into_iter().filter_map(|e| match e {
                        Event::Token { id, token, .. } if id == first => Some(token),
                        _ => None,
                    }));
                if had == 0 && !run.tokens.is_empty() {
                    run.first_step = step;
                }
                if had < 32 && run.tokens.len() > had {
                    run.step_32nd = step;
                }
            }
        }
        for (run, engine) in runs.iter_mut().zip(&engines) {
            run.proposed = engine.spec_stats.proposed;
            run.accepted = engine.spec_stats.accepted;
        }
        Ok(runs)
    }
}

/// Figures of one setting over one class of cases.
#[derive(Debug, Clone, Copy, Default)]
struct Sum {
    decoded: u64,
    decode_s: f64,
    steps: u64,
    to_32nd_s: f64,
    proposed: u64,
    accepted: u64,
}

impl Sum {
    /// `r`, decoded by `copies` requests together.
    fn add(&mut self, r: &Run, copies: usize) {
        self.decoded += copies as u64 * (r.tokens.len() as u64 - 1);
        self.decode_s += r.decode_s();
        self.steps += r.decode_steps() as u64;
        self.to_32nd_s += r.to_32nd_s();
        self.proposed += r.proposed;
        self.accepted += r.accepted;
    }
}

impl BackendTask for SpecBench<'_> {
    type Output = Result<()>;

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) -> Result<()> {
        let a = self.args;
        ensure!(a.runs >= 1, "--runs must be at least 1");
        ensure!(a.sequences >= 1, "--sequences must be at least 1");
        let model: Model<B> = load_model::<B>(self.gguf, &device, a.model.load_options())?;
        let prompts: Vec<Vec<u32>> = CASES
            .iter()
            .map(|c| self.prompt(c))
            .collect::<Result<_>>()?;
        println!(
            "backend: {} | adapter: {} | dtype: {}",
            info.kind, info.adapter, info.dtype
        );
        println!(
            "{} tokens per case, greedy, {} sequence(s) per case in one batch, up to {} drafted per step, self-draft of {} of {} layers, {} runs (the settings take turns step by step)",
            a.gen_tokens, a.sequences, a.spec_tokens, a.spec_draft_layers, model.config.n_layers, a.runs
        );
        // The warm-up run, then the measured ones: runs[case][setting][run].
        let mut runs: Vec<[Vec<Run>; 3]> = vec![Default::default(); CASES.len()];
        for _ in 0..=a.runs {
            for (c, prompt) in prompts.iter().enumerate() {
                for (k, r) in self.run_case(&model, prompt)?.into_iter().enumerate() {
                    runs[c][k].push(r);
                }
            }
        }
        // sums[class][setting], over each step's best time in the measured runs.
        let mut sums = [[Sum::default(); 3]; 2];
        for (c, case) in CASES.iter().enumerate() {
            for k in 0..SETTINGS.len() {
                let best = Run::best_steps(&runs[c][k][1..])?;
                sums[usize::from(!case.repetitive)][k].add(&best, a.sequences);
            }
        }
        println!();
        println!("| case | tokens | n-gram: same output, acceptance, tokens per pass | self-draft: same output, acceptance, tokens per pass |");
        println!("|---|---|---|---|");
        let mut all_same = true;
        for (c, case) in CASES.iter().enumerate() {
            let same = |k: usize| runs[c][k][0].tokens == runs[c][0][0].tokens;
            all_same &= same(1) && same(2);
            let cell = |k: usize| {
                let r = &runs[c][k][0];
                let rate = match r.proposed {
                    0 => "-".to_string(),
                    p => format!("{:.0}%", 100.0 * r.accepted as f64 / p as f64),
                };
                let per_pass = (r.tokens.len() as f64 - 1.0) / r.decode_steps().max(1) as f64;
                format!("{}, {rate}, {per_pass:.2}", yes(same(k)))
            };
            println!(
                "| {} | {} | {} | {} |",
                case.name,
                runs[c][0][0].tokens.len(),
                cell(1),
                cell(2)
            );
        }
        for (class, label) in [
            "repetitive (list, schedule, code, quote)",
            "free (story, explain, essay)",
        ]
        .iter()
        .enumerate()
        {
            println!();
            println!("{label}:");
            println!("| setting | acceptance | tokens per pass | decode tok/s | vs off | time to 32nd token | vs off |");
            println!("|---|---|---|---|---|---|---|");
            let sum = &sums[class];
            let tps = |k: usize| sum[k].decoded as f64 / sum[k].decode_s;
            let cases = CASES
                .iter()
                .filter(|c| c.repetitive == (class == 0))
                .count() as f64;
            let t32 = |k: usize| sum[k].to_32nd_s / cases;
            for (k, &setting) in SETTINGS.iter().enumerate() {
                let last = &sum[k];
                let acceptance = match last.proposed {
                    0 => "-".to_string(),
                    p => format!("{:.0}%", 100.0 * last.accepted as f64 / p as f64),
                };
                println!(
                    "| {} | {} | {:.2} | {:.1} | {:.2}x | {:.0} ms | {:.2}x |",
                    setting_name(setting),
                    acceptance,
                    last.decoded as f64 / last.steps as f64,
                    tps(k),
                    tps(k) / tps(0),
                    1000.0 * t32(k),
                    t32(0) / t32(k),
                );
            }
        }
        println!();
        println!(
            "decode tok/s and time to the 32nd token (mean per case): each step at its best time over the {} runs (a run repeats the same steps, so the best is the one least disturbed by other work on the machine)",
            a.runs
        );
        ensure!(all_same, "a setting changed the greedy output");
        Ok(())
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}

pub fn run(args: SpecBenchArgs) -> Result<()> {
    let file = args.model.open()?;
    let gguf = parse(&file)?;
    let tok = tokenizer(&gguf)?;
    args.model.run_on(SpecBench {
        args: &args,
        gguf: &gguf,
        tok: &tok,
    })?
}
