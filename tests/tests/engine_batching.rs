//! Continuous batching on the real model (CPU backend): eight prompts submitted together,
//! each with its own `max_tokens`, give exactly the greedy tokens each gives alone, also
//! when the KV pool is so small that requests must be preempted and recomputed.

use fornax_backends::{run_on, BackendKind, BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{KvCapacity, TierPolicy};
use fornax_engine::model::LlamaModel;
use fornax_engine::sampling::SamplingParams;
use fornax_engine::sched::{PolicyKind, RequestId, SchedulerConfig};
use fornax_engine::{generate, Engine, EngineBackend, Event, GenerateParams, Request};
use fornax_tests::{model_file, read_reference, Perplexity, Prompts};
use std::collections::HashMap;
use std::sync::OnceLock;

/// The three reference prompts and five cut from the reference text.
fn prompts() -> Vec<Vec<u32>> {
    let p: Prompts = read_reference("prompts.json");
    let text: Perplexity = read_reference("perplexity.json");
    let mut out: Vec<Vec<u32>> = p.prompts.into_iter().map(|c| c.prompt_ids).collect();
    out.extend((0..5).map(|i| text.ids[i * 100..i * 100 + 12 + 9 * i].to_vec()));
    out
}

struct Batching {
    /// Blocks of 32 tokens in the pool.
    blocks: usize,
}

impl BackendTask for Batching {
    type Output = ();

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) {
        let gguf = GgufFile::parse(model_file().bytes()).unwrap();
        let model = LlamaModel::<B>::from_gguf(&gguf, &device, &mut |_, _| {}).unwrap();
        let prompts = prompts();
        let max_tokens: Vec<usize> = (0..prompts.len()).map(|i| 5 + 4 * i).collect();

        // Both tests compare with the same solo runs: computed once per process.
        static ALONE: OnceLock<Vec<Vec<u32>>> = OnceLock::new();
        let alone = ALONE.get_or_init(|| {
            prompts
                .iter()
                .zip(&max_tokens)
                .map(|(p, &n)| {
                    let params = GenerateParams {
                        max_tokens: n,
                        ..GenerateParams::default()
                    };
                    generate(&model, p, &params, |_| true).unwrap()
                })
                .collect()
        });

        let kv = model.new_paged_cache(KvCapacity::f32_only(self.blocks), TierPolicy::DEFAULT);
        let mut engine = Engine::new(
            &model,
            kv,
            SchedulerConfig::default(),
            PolicyKind::default(),
        );
        let mut ids: HashMap<RequestId, usize> = HashMap::new();
        for (i, p) in prompts.iter().enumerate() {
            let id = engine
                .submit(Request {
                    prompt: p.clone(),
                    max_tokens: max_tokens[i],
                    qos: (i % 4) as u8,
                    sampling: SamplingParams::greedy(),
                    stop_ids: vec![],
                })
                .unwrap();
            ids.insert(id, i);
        }
        let mut got = vec![Vec::new(); prompts.len()];
        let mut finished = 0;
        let mut widest = 0;
        while !engine.is_idle() {
            for event in engine.step().unwrap() {
                match event {
                    Event::Token { id, token } => got[ids[&id]].push(token),
                    Event::Finished { .. } => finished += 1,
                }
            }
            widest = widest.max(engine.sched.running());
        }
        eprintln!(
            "{}: pool of {} blocks, {} steps, {} preemptions, up to {widest} sequences at once",
            info.adapter, self.blocks, engine.steps, engine.sched.preemptions
        );
        assert_eq!(finished, prompts.len());
        for (i, (g, a)) in got.iter().zip(alone).enumerate() {
            assert_eq!(g, a, "prompt {i}: batched vs alone");
        }
        assert_eq!(
            engine.kv_stats().blocks_used,
            0,
            "every block is back in the pool"
        );
        if self.blocks < 16 {
            assert!(
                engine.sched.preemptions > 0,
                "the small pool forced preemption"
            );
        } else {
            assert_eq!(engine.sched.preemptions, 0);
            assert!(widest >= 8, "all eight ran together");
        }
    }
}

#[test]
fn batched_greedy_tokens_equal_each_prompt_alone() {
    run_on(BackendKind::Cpu, Batching { blocks: 64 }).unwrap();
}

#[test]
fn preemption_keeps_every_output_unchanged() {
    // Each request needs at most 3 blocks alone; eight together need about 16.
    run_on(BackendKind::Cpu, Batching { blocks: 5 }).unwrap();
}

/// The engine on its own thread: requests sent through the command channel stream the
/// same tokens as alone; a client that hangs up mid-stream is cancelled and its blocks
/// return to the pool; a request that can never fit is refused at once.
struct Threaded;

impl BackendTask for Threaded {
    type Output = ();

    fn run<B: EngineBackend>(self, device: B::Device, _: DeviceInfo) {
        use fornax::engine_loop::{run_engine, Command, Update};
        use std::sync::mpsc::channel;
        use std::time::Duration;
        use tokio::sync::mpsc::unbounded_channel;

        let gguf = GgufFile::parse(model_file().bytes()).unwrap();
        let model = LlamaModel::<B>::from_gguf(&gguf, &device, &mut |_, _| {}).unwrap();
        let prompts = prompts();
        let request = |i: usize, max_tokens: usize| Request {
            prompt: prompts[i].clone(),
            max_tokens,
            qos: 0,
            sampling: SamplingParams::greedy(),
            stop_ids: vec![],
        };
        let want: Vec<Vec<u32>> = (0..2)
            .map(|i| {
                let params = GenerateParams {
                    max_tokens: 12,
                    ..GenerateParams::default()
                };
                generate(&model, &prompts[i], &params, |_| true).unwrap()
            })
            .collect();
        let kv = model.new_paged_cache(KvCapacity::f32_only(16), TierPolicy::DEFAULT);
        let mut engine = Engine::new(
            &model,
            kv,
            SchedulerConfig::default(),
            PolicyKind::default(),
        );
        let (commands, inbox) = channel();
        std::thread::scope(|s| {
            let runner = s.spawn(move || {
                run_engine(&mut engine, &inbox, Duration::from_millis(50));
                engine
            });
            let mut streams = Vec::new();
            for i in 0..2 {
                let (tx, rx) = unbounded_channel();
                commands
                    .send(Command::Submit {
                        request: request(i, 12),
                        updates: tx,
                    })
                    .unwrap();
                streams.push(rx);
            }
            // A client that reads one token and hangs up.
            let (tx, mut quitter) = unbounded_channel();
            commands
                .send(Command::Submit {
                    request: request(2, 200),
                    updates: tx,
                })
                .unwrap();
            // One that can never fit the 16-block pool.
            let (tx, mut refused) = unbounded_channel();
            commands
                .send(Command::Submit {
                    request: request(3, 600),
                    updates: tx,
                })
                .unwrap();
            assert!(matches!(
                refused.blocking_recv().unwrap(),
                Update::Rejected(_)
            ));
            assert!(matches!(
                quitter.blocking_recv().unwrap(),
                Update::Accepted(_)
            ));
            assert!(matches!(quitter.blocking_recv().unwrap(), Update::Token(_)));
            drop(quitter);
            for (i, mut rx) in streams.into_iter().enumerate() {
                let mut tokens = Vec::new();
                while let Some(update) = rx.blocking_recv() {
                    match update {
                        Update::Token(t) => tokens.push(t),
                        Update::Finished(_) => break,
                        Update::Accepted(_) => {}
                        other => panic!("prompt {i}: {other:?}"),
                    }
                }
                assert_eq!(tokens, want[i], "prompt {i}: streamed vs alone");
            }
            drop(commands);
            let engine = runner.join().unwrap();
            assert!(engine.is_idle(), "the hung-up request was cancelled");
            assert_eq!(engine.kv_stats().blocks_used, 0, "its blocks are back");
        });
    }
}

#[test]
fn engine_thread_streams_tokens_and_cancels_hung_up_clients() {
    run_on(BackendKind::Cpu, Threaded).unwrap();
}
