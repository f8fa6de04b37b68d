//! The host-memory tier on the real model (CPU backend). A batch-class request (200-token
//! prompt) is decoding on a 9-block FP32 pool when an interactive one (as long) arrives:
//! the first is preempted, its cached blocks are evicted for the second, and, with the
//! tier, kept in host memory and brought back when the first is admitted again. Both
//! outputs equal each prompt's greedy output alone, and fewer tokens are recomputed than
//! without the tier.

use crate::common::{model_file, read_reference, run_on, Perplexity};
use fornax_backends::{BackendKind, BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{HostStats, HostTier, KvCapacity, Tier, TierPolicy};
use fornax_engine::model::LlamaModel;
use fornax_engine::sampling::SamplingParams;
use fornax_engine::sched::{PolicyKind, RequestId, SchedulerConfig};
use fornax_engine::{generate, Engine, EngineBackend, Event, GenerateParams, Request};
use std::collections::HashMap;

const MAX_TOKENS: usize = 40;

/// Two prompts of 200 tokens: 7 blocks each with their outputs, 9 in the pool.
fn prompts() -> Vec<Vec<u32>> {
    let text: Perplexity = read_reference("perplexity.json");
    (0..2)
        .map(|i| text.ids[i * 600..i * 600 + 200].to_vec())
        .collect()
}

/// The batch request, then the interactive one once the first has 5 tokens; with
/// `host_blocks` of host memory when not 0.
struct Pressure {
    host_blocks: usize,
}

impl BackendTask for Pressure {
    /// Outputs, tokens recomputed after preemptions, preemptions, the tier's figures.
    type Output = (Vec<Vec<u32>>, u64, u64, Option<HostStats>);

    fn run<B: EngineBackend>(self, device: B::Device, _: DeviceInfo) -> Self::Output {
        let gguf = GgufFile::parse(model_file().bytes()).unwrap();
        let model = LlamaModel::<B>::from_gguf(&gguf, &device, &mut |_, _| {}).unwrap();
        let mut kv = model.new_paged_cache(KvCapacity::f32_only(9), TierPolicy::ALL_F32);
        if self.host_blocks > 0 {
            let block_bytes = model.kv_dims().block_bytes(Tier::F32);
            kv.pool
                .enable_host_tier(HostTier::new(self.host_blocks * block_bytes, block_bytes));
        }
        let mut engine = Engine::new(
            &model,
            kv,
            SchedulerConfig::default(),
            PolicyKind::default(),
        )
        .with_prefix_cache();
        let prompts = prompts();
        let request = |i: usize| Request {
            prompt: prompts[i].clone(),
            max_tokens: MAX_TOKENS,
            qos: if i == 0 { 3 } else { 0 },
            sampling: SamplingParams::greedy(),
            stop_ids: vec![],
        };
        let mut ids: HashMap<RequestId, usize> = HashMap::new();
        ids.insert(engine.submit(request(0)).unwrap(), 0);
        let mut got = vec![Vec::new(); prompts.len()];
        while !engine.is_idle() {
            for event in engine.step().unwrap() {
                if let Event::Token { id, token } = event {
                    got[ids[&id]].push(token);
                }
            }
            if got[0].len() == 5 && ids.len() == 1 {
                ids.insert(engine.submit(request(1)).unwrap(), 1);
            }
        }
        assert_eq!(engine.kv_stats().blocks_used, 0, "every block is back");
        eprintln!(
            "host blocks {}: {} tokens computed in {} steps",
            self.host_blocks, engine.tokens_computed, engine.steps
        );
        (
            got,
            engine.sched.recomputed,
            engine.sched.preemptions,
            engine.kv.pool.host_stats(),
        )
    }
}

/// Each prompt's greedy output alone.
struct Alone;

impl BackendTask for Alone {
    type Output = Vec<Vec<u32>>;

    fn run<B: EngineBackend>(self, device: B::Device, _: DeviceInfo) -> Self::Output {
        let gguf = GgufFile::parse(model_file().bytes()).unwrap();
        let model = LlamaModel::<B>::from_gguf(&gguf, &device, &mut |_, _| {}).unwrap();
        let params = GenerateParams {
            max_tokens: MAX_TOKENS,
            ..GenerateParams::default()
        };
        prompts()
            .iter()
            .map(|p| generate(&model, p, &params, |_| true).unwrap())
            .collect()
    }
}

#[test]
fn preempted_requests_resume_from_host_memory_with_unchanged_outputs() {
    let alone = run_on(BackendKind::Cpu, Alone).unwrap();
    let (plain, recomputed_plain, preempted_plain, none) =
        run_on(BackendKind::Cpu, Pressure { host_blocks: 0 }).unwrap();
    let (tiered, recomputed, preempted, host) =
        run_on(BackendKind::Cpu, Pressure { host_blocks: 64 }).unwrap();
    let host = host.expect("the tier is on");
    eprintln!(
        "without the tier: {preempted_plain} preemptions, {recomputed_plain} tokens recomputed; with it: {preempted} preemptions, {recomputed} recomputed; {host:?}"
    );
    assert!(none.is_none());
    assert_eq!(plain, alone, "without the tier");
    assert_eq!(tiered, alone, "with the tier");
    assert!(preempted > 0, "the small pool forced preemption");
    assert!(host.stored > 0 && host.restored > 0, "{host:?}");
    assert!(
        recomputed < recomputed_plain,
        "{recomputed} recomputed with the tier, {recomputed_plain} without"
    );
}
