//! The scheduler without a model: a fake "model" whose next token is a function of the
//! whole context it was fed, so any token fed wrongly (after a preemption, across chunks)
//! changes the outputs.

use std::collections::HashMap;

use super::{FinishReason, PolicyKind, RequestId, Scheduler, SchedulerConfig, StepPlan};
use crate::kv::{BlockPool, KvCapacity, SeqId, TierPolicy};

/// The fake model: per sequence, the tokens fed so far.
#[derive(Default)]
struct FakeModel {
    fed: HashMap<SeqId, Vec<u32>>,
}

fn next_token(context: &[u32]) -> u32 {
    let h = context
        .iter()
        .fold(17u64, |h, &t| h.wrapping_mul(31).wrapping_add(u64::from(t)));
    (h % 1000) as u32 + 1
}

impl FakeModel {
    /// Runs a planned step: returns (request, finish) per finished request.
    fn step(
        &mut self,
        sched: &mut Scheduler,
        pool: &mut BlockPool,
        plan: &StepPlan,
    ) -> Vec<(RequestId, FinishReason)> {
        for &id in &plan.preempted {
            // A preempted request's sequence is gone; its replacement starts empty.
            assert_eq!(sched.get(id).unwrap().computed, 0);
        }
        self.fed.retain(|seq, _| pool.len(*seq).is_ok());
        let mut done = Vec::new();
        for s in &plan.batch {
            pool.reserve(s.seq, s.tokens.len()).unwrap_or_else(|e| {
                panic!("the plan fits the pool: {e} {plan:?} {:?}", pool.stats())
            });
            pool.advance(s.seq, s.tokens.len()).unwrap();
            let fed = self.fed.entry(s.seq).or_default();
            fed.extend_from_slice(&s.tokens);
            let sampled = s.samples.then(|| next_token(fed));
            if let Some(reason) = sched.complete(s, sampled, &[]) {
                done.push((s.id, reason));
            }
        }
        done
    }
}

fn pool(blocks: usize) -> BlockPool {
    BlockPool::new(KvCapacity::f32_only(blocks), TierPolicy::ALL_F32)
}

fn config(tokens: usize, seqs: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_batch_tokens: tokens,
        max_batch: seqs,
        max_seq_len: 4096,
        window: None,
    }
}

/// What a request generates when run alone.
fn alone(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let mut ctx = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..max_tokens {
        let t = next_token(&ctx);
        out.push(t);
        ctx.push(t);
    }
    out
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 7 + seed * 13) % 500 + 1)
        .collect()
}

/// Runs until every request finishes (or `max_steps`), returning the outputs.
fn run_all(
    sched: &mut Scheduler,
    pool: &mut BlockPool,
    mut check: impl FnMut(&StepPlan),
    max_steps: usize,
) -> HashMap<RequestId, Vec<u32>> {
    let mut model = FakeModel::default();
    let mut outputs = HashMap::new();
    for _ in 0..max_steps {
        if sched.is_empty() {
            break;
        }
        let plan = sched.plan(pool);
        check(&plan);
        for (id, _) in model.step(sched, pool, &plan) {
            let e = sched.remove(id, pool).unwrap();
            outputs.insert(id, e.tokens[e.prompt_len..].to_vec());
        }
    }
    assert!(sched.is_empty(), "requests left after {max_steps} steps");
    outputs
}

#[test]
fn budgets_are_respected_and_outputs_match_running_alone() {
    let mut pool = pool(64);
    let mut sched = Scheduler::new(config(100, 5), PolicyKind::QosAging);
    let mut want = HashMap::new();
    for i in 0..12u32 {
        let (p, n) = (prompt(i, 10 + 37 * i as usize % 150), 3 + i as usize % 9);
        let id = sched.submit(p.clone(), n, (i % 4) as u8, &pool).unwrap();
        want.insert(id, alone(&p, n));
    }
    let got = run_all(
        &mut sched,
        &mut pool,
        |plan| {
            assert!(plan.tokens() <= 100, "token budget: {}", plan.tokens());
            assert!(plan.batch.len() <= 5, "sequence cap: {}", plan.batch.len());
        },
        10_000,
    );
    assert_eq!(got, want);
    assert_eq!(pool.stats().blocks_used, 0, "every block is back");
}

#[test]
fn chunked_prefill_runs_beside_decodes() {
    let mut pool = pool(256);
    let mut sched = Scheduler::new(config(512, 8), PolicyKind::Fcfs);
    let short = sched.submit(prompt(1, 20), 40, 0, &pool).unwrap();
    // Two steps: the short prompt is prefilled and decoding.
    let mut model = FakeModel::default();
    for _ in 0..2 {
        let plan = sched.plan(&mut pool);
        model.step(&mut sched, &mut pool, &plan);
    }
    let long = sched.submit(prompt(2, 3000), 4, 0, &pool).unwrap();
    let mut chunks = 0;
    while sched.get(long).unwrap().computed < 3000 {
        let plan = sched.plan(&mut pool);
        let decode = plan
            .batch
            .iter()
            .find(|s| s.id == short)
            .expect("decode never stalls");
        assert_eq!(decode.tokens.len(), 1);
        let chunk = plan.batch.iter().find(|s| s.id == long).unwrap();
        assert!(chunk.tokens.len() <= 511);
        chunks += 1;
        model.step(&mut sched, &mut pool, &plan);
    }
    assert_eq!(
        chunks,
        3000usize.div_ceil(511),
        "prefill in budget-sized chunks"
    );
}

/// 12 blocks of 32 tokens for 6 requests that each grow to 4-5 blocks, with `window`:
/// checks that every output equals the request alone and every block comes back, and
/// returns the preemptions and the pool's final figures.
fn serve_in_twelve_blocks(window: Option<super::ElasticWindow>) -> (u64, crate::kv::KvStats) {
    let mut pool = pool(12);
    let config = SchedulerConfig {
        window,
        ..config(256, 8)
    };
    let mut sched = Scheduler::new(config, PolicyKind::QosAging);
    let mut want = HashMap::new();
    for i in 0..6u32 {
        let (p, n) = (prompt(i, 60 + 10 * i as usize), 70);
        let id = sched.submit(p.clone(), n, (i % 2) as u8, &pool).unwrap();
        want.insert(id, alone(&p, n));
    }
    let got = run_all(&mut sched, &mut pool, |_| {}, 10_000);
    // The fake model remembers every token it was fed, so trimming leaves its outputs
    // alone: equal outputs mean every token was fed exactly once.
    assert_eq!(got, want);
    assert_eq!(pool.stats().blocks_used, 0, "every block is back");
    (sched.preemptions, pool.stats())
}

#[test]
fn preempted_requests_resume_with_the_same_output() {
    let (preemptions, _) = serve_in_twelve_blocks(None);
    assert!(
        preemptions > 0,
        "the pool was too small to avoid preemption"
    );
}

#[test]
fn requests_that_can_never_run_are_refused_at_submission() {
    let pool = pool(4);
    let mut sched = Scheduler::new(config(256, 8), PolicyKind::Fcfs);
    assert!(
        sched.submit(prompt(0, 100), 28, 0, &pool).is_ok(),
        "127 tokens fit 4 blocks"
    );
    let too_big = sched.submit(prompt(0, 100), 30, 0, &pool).unwrap_err();
    assert!(too_big.to_string().contains("can never fit"), "{too_big}");
    assert!(
        sched.submit(prompt(0, 4000), 100, 0, &pool).is_err(),
        "context"
    );
    assert!(sched.submit(vec![], 10, 0, &pool).is_err());
    assert!(sched.submit(prompt(0, 5), 0, 0, &pool).is_err());
    assert!(sched.submit(prompt(0, 5), 5, 4, &pool).is_err());
}

#[test]
fn cancelled_requests_return_their_blocks_at_once() {
    let mut pool = pool(32);
    let mut sched = Scheduler::new(config(512, 8), PolicyKind::Fcfs);
    let id = sched.submit(prompt(0, 200), 10, 0, &pool).unwrap();
    let plan = sched.plan(&mut pool);
    FakeModel::default().step(&mut sched, &mut pool, &plan);
    assert_eq!(pool.stats().blocks_used, 7);
    assert!(sched.remove(id, &mut pool).is_some());
    assert_eq!(pool.stats().blocks_used, 0);
    assert!(sched.is_empty());
}

/// Under a steady stream of interactive requests that alone keep the engine full, batch
/// requests still finish with the default policy; FCFS serves everyone in order too, but
/// the seed's score lets long batch requests wait as long as shorter work keeps coming.
#[test]
fn no_starvation_over_ten_thousand_steps_with_mixed_qos() {
    let waits = |policy: PolicyKind| {
        let mut pool = pool(64);
        let mut sched = Scheduler::new(config(64, 4), policy);
        let mut model = FakeModel::default();
        let mut submitted = HashMap::new();
        let mut worst_wait = 0usize;
        let mut finished_batch = 0;
        let mut unfinished_batch_age = 0usize;
        for step in 0..10_000usize {
            // One interactive request every 2 steps (16-token prompt, 8 tokens: more
            // than the 4-sequence cap can keep up with alone) and a long batch one every 50.
            if step % 2 == 0 {
                let id = sched.submit(prompt(step as u32, 16), 8, 0, &pool).unwrap();
                submitted.insert(id, (step, 0u8));
            }
            if step % 50 == 0 {
                let id = sched
                    .submit(prompt(step as u32, 120), 16, 3, &pool)
                    .unwrap();
                submitted.insert(id, (step, 3u8));
            }
            let plan = sched.plan(&mut pool);
            for (id, _) in model.step(&mut sched, &mut pool, &plan) {
                sched.remove(id, &mut pool);
                let (at, qos) = submitted.remove(&id).unwrap();
                if qos == 3 {
                    finished_batch += 1;
                    worst_wait = worst_wait.max(step - at);
                }
            }
        }
        for &(at, qos) in submitted.values() {
            if qos == 3 {
                unfinished_batch_age = unfinished_batch_age.max(10_000 - at);
            }
        }
        (finished_batch, worst_wait, unfinished_batch_age)
    };
    let (done, worst, stuck) = waits(PolicyKind::QosAging);
    eprintln!("qos-aging: {done} batch requests finished, worst wait {worst} steps, oldest unfinished {stuck}");
    assert!(done >= 150, "batch requests finished: {done} of 200");
    assert!(stuck <= 2_000, "a batch request waited {stuck} steps");
    let (done, worst, stuck) = waits(PolicyKind::Seed);
    eprintln!(
        "seed: {done} batch requests finished, worst wait {worst} steps, oldest unfinished {stuck}"
    );
}

#[test]
fn an_elastic_window_trims_instead_of_preempting() {
    // The workload that preempts above, with sequences trimmed to a sink block and their
    // newest 32 tokens when blocks run out.
    let (preempted, full) = serve_in_twelve_blocks(None);
    assert!(preempted > 0);
    assert_eq!(full.window_trims, 0);
    let window = super::ElasticWindow {
        a: 0.0,
        b: 32.0,
        ..Default::default()
    };
    let (preempted, trimmed) = serve_in_twelve_blocks(Some(window));
    assert_eq!(preempted, 0, "trimming made room");
    assert!(trimmed.window_trims > 0);
    assert_eq!(
        trimmed.window_dropped_tokens % 32,
        0,
        "whole blocks are dropped"
    );
}

#[test]
fn a_lone_prefill_larger_than_the_fp32_tier_runs_in_parts() {
    // 4 FP32 blocks (128 tokens) for a 200-token prompt: older blocks age into FP16
    // between the parts. Planned whole, it would wait forever.
    let policy = TierPolicy {
        recent: Some(32),
        int8_after: None,
    };
    let mut pool = BlockPool::new(KvCapacity::tiers([4, 16, 0]), policy);
    let mut sched = Scheduler::new(config(256, 4), PolicyKind::Fcfs);
    let p = prompt(3, 200);
    let id = sched.submit(p.clone(), 20, 0, &pool).unwrap();
    let mut sizes = Vec::new();
    let got = run_all(
        &mut sched,
        &mut pool,
        |plan| sizes.extend(plan.batch.iter().map(|s| s.tokens.len())),
        1_000,
    );
    assert_eq!(got[&id], alone(&p, 20));
    assert_eq!(sizes[..2], [128, 72]);
    assert_eq!(sched.preemptions, 0);
}
