//! The host-memory tier on the real model (CPU backend). A batch-class request (200-token
//! prompt) is decoding on a 9-block FP32 pool when an interactive one (as long) arrives:
//! the first is preempted, its cached blocks are evicted for the second, and, with the
//! tier, kept in host memory with its partly filled last block and brought back when the
//! first is admitted again. Both outputs equal each prompt's greedy output alone, and with
//! the tier nothing is recomputed.

use crate::common::{model_file, read_reference, run_on, Perplexity};
use fornax_backends::{BackendKind, BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{HostStats, HostTier, KvCapacity, Tier, TierPolicy};
use fornax_engine::model::Model;
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

/// Twelve prompts of 37 to 121 tokens, for a pool far smaller than they need together.
fn churn_prompts() -> Vec<Vec<u32>> {
    let text: Perplexity = read_reference("perplexity.json");
    (0..12)
        .map(|i| text.ids[i * 128..i * 128 + 37 + 12 * (i % 8)].to_vec())
        .collect()
}

/// Runs `prompts` on a pool of `pool_blocks`, with `host_blocks` of host memory when not
/// 0. `staggered`: the first (batch class) alone, then the second (interactive) once the
/// first has 5 tokens; otherwise all at once, QoS by turns.
struct Pressure {
    prompts: Vec<Vec<u32>>,
    pool_blocks: usize,
    host_blocks: usize,
    staggered: bool,
}

impl Pressure {
    fn pair(host_blocks: usize) -> Self {
        Self {
            prompts: prompts(),
            pool_blocks: 9,
            host_blocks,
            staggered: true,
        }
    }

    fn churn(host_blocks: usize) -> Self {
        Self {
            prompts: churn_prompts(),
            pool_blocks: 12,
            host_blocks,
            staggered: false,
        }
    }
}

impl BackendTask for Pressure {
    /// Outputs, tokens recomputed after preemptions, preemptions, the tier's figures.
    type Output = (Vec<Vec<u32>>, u64, u64, Option<HostStats>);

    fn run<B: EngineBackend>(self, device: B::Device, _: DeviceInfo) -> Self::Output {
        let gguf = GgufFile::parse(model_file().bytes()).unwrap();
        let model = Model::<B>::from_gguf(&gguf, &device, &mut |_, _| {}).unwrap();
        let mut kv =
            model.new_paged_cache(KvCapacity::f32_only(self.pool_blocks), TierPolicy::ALL_F32);
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
        let prompts = &self.prompts;
        let staggered = self.staggered;
        let request = |i: usize| Request {
            prompt: prompts[i].clone(),
            max_tokens: MAX_TOKENS,
            qos: match (staggered, i) {
                (true, 0) => 3,
                (true, _) => 0,
                (false, i) => (i % 4) as u8,
            },
            sampling: SamplingParams::greedy(),
            stop_ids: vec![],
            constraint: None,
            logprobs: None,
            prompt_logprobs: None,
        };
        let mut ids: HashMap<RequestId, usize> = HashMap::new();
        let first = if staggered { 1 } else { prompts.len() };
        for i in 0..first {
            ids.insert(engine.submit(request(i)).unwrap(), i);
        }
        let mut got = vec![Vec::new(); prompts.len()];
        while !engine.is_idle() {
            for event in engine.step().unwrap() {
                if let Event::Token { id, token, .. } = event {
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
struct Alone(Vec<Vec<u32>>);

impl BackendTask for Alone {
    type Output = Vec<Vec<u32>>;

    fn run<B: EngineBackend>(self, device: B::Device, _: DeviceInfo) -> Self::Output {
        let gguf = GgufFile::parse(model_file().bytes()).unwrap();
        let model = Model::<B>::from_gguf(&gguf, &device, &mut |_, _| {}).unwrap();
        let params = GenerateParams {
            max_tokens: MAX_TOKENS,
            ..GenerateParams::default()
        };
        self.0
            .iter()
            .map(|p| generate(&model, p, &params, |_| true).unwrap())
            .collect()
    }
}

#[test]
fn preempted_requests_resume_from_host_memory_with_unchanged_outputs() {
    let alone = run_on(BackendKind::Cpu, Alone(prompts())).unwrap();
    let (plain, recomputed_plain, preempted_plain, none) =
        run_on(BackendKind::Cpu, Pressure::pair(0)).unwrap();
    let (tiered, recomputed, preempted, host) =
        run_on(BackendKind::Cpu, Pressure::pair(64)).unwrap();
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
        recomputed_plain > 0,
        "without the tier the preempted request recomputes"
    );
    assert_eq!(
        recomputed, 0,
        "the preempted request resumes from host memory ({recomputed_plain} without the tier)"
    );
}

/// Twelve requests at once on a pool that holds about three: requests are preempted, admitted
/// and put off over and over, their blocks evicted, brought back and evicted again within
/// steps. Every output still equals the prompt's output alone.
#[test]
fn outputs_are_unchanged_when_blocks_churn_through_host_memory() {
    let alone = run_on(BackendKind::Cpu, Alone(churn_prompts())).unwrap();
    let (tiered, recomputed, preempted, host) =
        run_on(BackendKind::Cpu, Pressure::churn(256)).unwrap();
    let host = host.expect("the tier is on");
    eprintln!("{preempted} preemptions, {recomputed} tokens recomputed; {host:?}");
    assert!(preempted >= 4, "{preempted} preemptions");
    assert!(host.restored > 0, "{host:?}");
    for (i, (got, want)) in tiered.iter().zip(&alone).enumerate() {
        assert_eq!(got, want, "request {i}");
    }
}
