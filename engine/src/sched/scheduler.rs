//! The batch builder: which requests run how many tokens each step, and who is preempted.

use std::collections::{BTreeMap, HashMap};

use super::{
    ElasticWindow, Entry, FinishReason, KvBlocks, Policy, PolicyKind, RequestId, SubmitError,
};
use crate::kv::{SeqId, BLOCK_TOKENS};

/// The most of `n` tokens whose blocks (`needed(m)` for `m` tokens, growing with `m`) fit
/// in `free`; 0 if none do.
fn fitting(n: usize, free: usize, needed: impl Fn(usize) -> usize) -> usize {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if needed(mid) <= free {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Limits of one step.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    /// Tokens per step, all sequences together (`--max-batch-tokens`).
    pub max_batch_tokens: usize,
    /// Sequences per step (`--max-batch`).
    pub max_batch: usize,
    /// The model's context length.
    pub max_seq_len: usize,
    /// Trim sequences to an elastic window before preempting (`--kv-window elastic`).
    pub window: Option<ElasticWindow>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_batch_tokens: 2048,
            max_batch: 64,
            max_seq_len: 8192,
            window: None,
        }
    }
}

/// One request's share of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduled {
    pub id: RequestId,
    pub seq: SeqId,
    /// The tokens to run, continuing after those already computed.
    pub tokens: Vec<u32>,
    /// Whether they complete the request's context, so the step's last logits give its
    /// next token.
    pub samples: bool,
    /// Drafted tokens at the end of `tokens` (speculative decoding), to be verified.
    pub drafted: usize,
}

impl Scheduled {
    /// The drafted tokens it runs.
    pub fn draft(&self) -> &[u32] {
        &self.tokens[self.tokens.len() - self.drafted..]
    }
}

/// What one step runs.
#[derive(Debug, Clone, Default)]
pub struct StepPlan {
    pub batch: Vec<Scheduled>,
    /// Requests preempted to make room: their blocks are freed, they recompute later.
    pub preempted: Vec<RequestId>,
}

impl StepPlan {
    /// Tokens in the batch.
    pub fn tokens(&self) -> usize {
        self.batch.iter().map(|s| s.tokens.len()).sum()
    }
}

/// Requests in flight and the policy that orders them.
pub struct Scheduler {
    pub config: SchedulerConfig,
    policy: Box<dyn Policy>,
    requests: BTreeMap<RequestId, Entry>,
    next_id: u64,
    step: u64,
    /// Preemptions so far.
    pub preemptions: u64,
    /// Tokens preempted requests had computed and computed again (what the prefix cache
    /// and its host tier did not give back when they were admitted again).
    pub recomputed: u64,
}

impl Scheduler {
    /// An empty scheduler.
    pub fn new(config: SchedulerConfig, policy: PolicyKind) -> Self {
        Self {
            policy: policy.build(config.max_seq_len),
            config,
            requests: BTreeMap::new(),
            next_id: 0,
            step: 0,
            preemptions: 0,
            recomputed: 0,
        }
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Queues a request; refuses at once one that could never run.
    pub fn submit(
        &mut self,
        prompt: Vec<u32>,
        max_tokens: usize,
        qos: u8,
        kv: &impl KvBlocks,
    ) -> Result<RequestId, SubmitError> {
        if prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if max_tokens == 0 {
            return Err(SubmitError::NoTokensWanted);
        }
        if qos > 3 {
            return Err(SubmitError::BadQos(qos));
        }
        let (p, limit) = (prompt.len(), self.config.max_seq_len);
        if p + max_tokens > limit {
            return Err(SubmitError::ContextOverflow {
                prompt: p,
                max_tokens,
                limit,
            });
        }
        // The last generated token is never fed back, so `p + max_tokens - 1` are cached.
        let capacity = kv.capacity_tokens();
        if (p + max_tokens - 1).div_ceil(BLOCK_TOKENS) * BLOCK_TOKENS > capacity {
            return Err(SubmitError::NeverFits {
                prompt: p,
                max_tokens,
                capacity,
            });
        }
        let id = RequestId(self.next_id);
        self.next_id += 1;
        self.requests.insert(
            id,
            Entry {
                id,
                qos,
                arrival: id.0,
                submitted_step: self.step,
                prompt_len: p,
                tokens: prompt,
                max_tokens,
                computed: 0,
                seq: None,
                preemptions: 0,
                lost: 0,
                prompt_chunk: None,
            },
        );
        Ok(id)
    }

    /// Has `id` compute every position of its prompt, at most `chunk` tokens a step,
    /// without the prefix cache: the logits of each are read.
    pub fn compute_whole_prompt(&mut self, id: RequestId, chunk: usize) {
        if let Some(r) = self.requests.get_mut(&id) {
            r.prompt_chunk = Some(chunk.max(1));
        }
    }

    /// A request's progress.
    pub fn get(&self, id: RequestId) -> Option<&Entry> {
        self.requests.get(&id)
    }

    /// Requests not finished.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// Whether no request is in flight.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Every request in flight, by id.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.requests.values()
    }

    /// Requests holding KV blocks.
    pub fn running(&self) -> usize {
        self.requests.values().filter(|r| r.seq.is_some()).count()
    }

    /// Removes a request and frees its blocks; `None` if it was not in flight.
    pub fn remove(&mut self, id: RequestId, kv: &mut impl KvBlocks) -> Option<Entry> {
        let entry = self.requests.remove(&id)?;
        if let Some(seq) = entry.seq {
            kv.free_sequence(seq);
        }
        Some(entry)
    }

    /// Plans the next step: requests in policy order catch up as far as the token budget,
    /// the sequence cap and the free blocks allow. When blocks run out, requests later in
    /// the order are preempted for earlier ones; a request that cannot get blocks and has
    /// no one behind it to preempt gives up its own so that those ahead can progress.
    pub fn plan(&mut self, kv: &mut impl KvBlocks) -> StepPlan {
        self.plan_with_drafts(kv, &HashMap::new())
    }

    /// [`Self::plan`], where a request that samples this step also runs as much of its
    /// draft (`drafts`) as the token budget and the free blocks allow: drafted tokens
    /// never preempt anyone.
    pub fn plan_with_drafts(
        &mut self,
        kv: &mut impl KvBlocks,
        drafts: &HashMap<RequestId, Vec<u32>>,
    ) -> StepPlan {
        let step = self.step;
        self.step += 1;
        let mut order: Vec<(f64, u64, RequestId)> = self
            .requests
            .values()
            .map(|r| (self.policy.key(r, step), r.arrival, r.id))
            .collect();
        order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let order: Vec<RequestId> = order.into_iter().map(|(_, _, id)| id).collect();

        let mut plan = StepPlan::default();
        let mut budget = self.config.max_batch_tokens;
        let mut free = kv.free_blocks();
        for (rank, &id) in order.iter().enumerate() {
            if budget == 0 || plan.batch.len() == self.config.max_batch {
                break;
            }
            // A request without blocks starts with whatever the prefix cache holds of it.
            let fresh = self.requests[&id].seq.is_none();
            if fresh && !self.admit(id, kv, &mut free) {
                continue;
            }
            let r = &self.requests[&id];
            let seq = r.seq.expect("admitted");
            let mut n = r.pending().min(budget);
            if let Some(chunk) = r.prompt_chunk.filter(|_| r.computed < r.prompt_len) {
                n = n.min(chunk);
            }
            let mut needed = kv.blocks_needed(seq, n);
            if needed > free {
                free += self.trim_to_window(&order, needed - free, kv);
            }
            // Preempt from the back of the order (not yet planned, holding blocks).
            while needed > free {
                let victim = order[rank + 1..]
                    .iter()
                    .rev()
                    .find(|v| self.requests[v].seq.is_some())
                    .copied();
                let Some(victim) = victim else { break };
                free += self.preempt(victim, kv);
                plan.preempted.push(victim);
            }
            if needed > free && plan.batch.is_empty() && self.running() == 1 {
                // Alone in the pool, a prefill chunk larger than the free blocks runs in
                // part: no one else will free room for it.
                n = fitting(n, free, |m| kv.blocks_needed(seq, m));
                needed = kv.blocks_needed(seq, n);
            }
            if n == 0 || needed > free {
                if fresh {
                    // Not started: it waits, and its cached blocks stay cached.
                    let r = self.requests.get_mut(&id).expect("in flight");
                    let before = kv.free_blocks();
                    kv.abandon_sequence(r.seq.take().expect("admitted"));
                    r.computed = 0;
                    free += kv.free_blocks() - before;
                } else {
                    // Nobody behind it holds blocks: it yields its own.
                    free += self.preempt(id, kv);
                    plan.preempted.push(id);
                }
                continue;
            }
            free -= needed;
            budget -= n;
            let r = &self.requests[&id];
            // Tokens below what it had computed before a preemption are computed again.
            self.recomputed += ((r.computed + n).min(r.lost) - r.computed.min(r.lost)) as u64;
            let mut tokens = r.tokens[r.computed..r.computed + n].to_vec();
            let samples = r.computed + n == r.tokens.len();
            let mut drafted = 0;
            if let Some(draft) = drafts.get(&id).filter(|_| samples) {
                drafted = fitting(draft.len().min(budget), free, |m| {
                    kv.blocks_needed(seq, n + m) - needed
                });
                free -= kv.blocks_needed(seq, n + drafted) - needed;
                budget -= drafted;
                tokens.extend_from_slice(&draft[..drafted]);
            }
            plan.batch.push(Scheduled {
                id,
                seq,
                tokens,
                samples,
                drafted,
            });
        }
        plan
    }

    /// Gives `id` a sequence holding the cached blocks of its tokens (its computed tokens
    /// start there). Refused, with nothing changed, when reviving cached blocks would take
    /// free blocks promised to requests planned ahead of it.
    fn admit(&mut self, id: RequestId, kv: &mut impl KvBlocks, free: &mut usize) -> bool {
        let r = self.requests.get_mut(&id).expect("in flight");
        let before = kv.free_blocks();
        let cap = match r.prompt_chunk {
            Some(_) => 0,
            None => usize::MAX,
        };
        let (seq, hit) = kv.add_sequence_with_prefix(&r.tokens, cap);
        let revived = before - kv.free_blocks();
        if revived > *free {
            kv.abandon_sequence(seq);
            return false;
        }
        *free -= revived;
        r.seq = Some(seq);
        r.computed = hit;
        true
    }

    /// With the elastic window on, trims running sequences from the back of `order` to
    /// their sinks plus the newest W tokens until `short` blocks are free. Returns blocks
    /// freed.
    fn trim_to_window(
        &mut self,
        order: &[RequestId],
        short: usize,
        kv: &mut impl KvBlocks,
    ) -> usize {
        let Some(w) = self.config.window else {
            return 0;
        };
        let window = w.tokens(self.running()).min(self.config.max_seq_len);
        let before = kv.free_blocks();
        for id in order.iter().rev() {
            if let Some(seq) = self.requests[id].seq {
                kv.trim_window(seq, w.sink_blocks, window);
                if kv.free_blocks() - before >= short {
                    break;
                }
            }
        }
        kv.free_blocks() - before
    }

    /// Frees `id`'s blocks; it will start again from what the prefix cache (and its host
    /// tier) still holds of it. Returns blocks freed.
    fn preempt(&mut self, id: RequestId, kv: &mut impl KvBlocks) -> usize {
        let r = self.requests.get_mut(&id).expect("in flight");
        let seq = r.seq.take().expect("holds blocks");
        let before = kv.free_blocks();
        kv.preempt_sequence(seq, &r.tokens[..r.computed]);
        r.lost = r.lost.max(r.computed);
        r.computed = 0;
        r.preemptions += 1;
        self.preemptions += 1;
        kv.free_blocks() - before
    }

    /// Records that `s` ran (its tokens are now cached) and, when it sampled, the new
    /// token; returns why the request finished, if it did. A finished request stays until
    /// [`Self::remove`].
    pub fn complete(
        &mut self,
        s: &Scheduled,
        sampled: Option<u32>,
        stop_ids: &[u32],
    ) -> Option<FinishReason> {
        self.complete_verified(s, 0, sampled.as_slice(), stop_ids).1
    }

    /// [`Self::complete`] for a step that may have verified a draft: the first `accepted`
    /// drafted tokens stay cached (the rest were taken back) and `emitted` are the new
    /// tokens in order. Returns how many of them the request took (it stops at a stop
    /// token or at `max_tokens`) and why it finished, if it did.
    pub fn complete_verified(
        &mut self,
        s: &Scheduled,
        accepted: usize,
        emitted: &[u32],
        stop_ids: &[u32],
    ) -> (usize, Option<FinishReason>) {
        let Some(r) = self.requests.get_mut(&s.id) else {
            return (0, None);
        };
        r.computed += s.tokens.len() - s.drafted + accepted;
        let mut result = (emitted.len(), None);
        for (i, &token) in emitted.iter().enumerate() {
            r.tokens.push(token);
            if stop_ids.contains(&token) {
                result = (i + 1, Some(FinishReason::Stop));
            } else if r.generated() >= r.max_tokens {
                result = (i + 1, Some(FinishReason::Length));
            } else {
                continue;
            }
            break;
        }
        // Finished on an accepted drafted token: what is cached past it is not its own.
        r.computed = r.computed.min(r.tokens.len());
        result
    }
}
