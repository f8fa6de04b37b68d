//! The step loop: requests in, one forward pass over the scheduler's ragged batch per
//! step, sampled tokens out. Thread-free; a caller drives [`Engine::step`].

use std::collections::HashMap;

use burn::tensor::{Int, Tensor, TensorData};

use crate::kv::{KvStats, PagedKv};
use crate::model::{LlamaModel, Logits, ModelError, SeqTokens};
use crate::sampling::{pick_rows, Sampler, SamplingParams};
use crate::sched::{
    FinishReason, KvBlocks, PolicyKind, RequestId, Scheduler, SchedulerConfig, SubmitError,
};
use crate::EngineBackend;

/// A generation request.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    /// QoS class: 0 interactive .. 3 batch.
    pub qos: u8,
    pub sampling: SamplingParams,
    /// Generation stops after emitting any of these.
    pub stop_ids: Vec<u32>,
}

/// What a step produced for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A new token.
    Token { id: RequestId, token: u32 },
    /// The request is done and its blocks are back in the pool.
    Finished { id: RequestId, reason: FinishReason },
}

/// Per-request sampling state.
struct Decoding {
    sampler: Sampler,
    stop_ids: Vec<u32>,
}

/// A model, its KV pool and the scheduler.
pub struct Engine<'m, B: EngineBackend> {
    model: &'m LlamaModel<B>,
    pub kv: PagedKv<B>,
    pub sched: Scheduler,
    decoding: HashMap<RequestId, Decoding>,
    /// Steps run and tokens computed in them.
    pub steps: u64,
    pub tokens_computed: u64,
    /// Sequences and tokens of the last step's batch.
    pub last_batch: (usize, usize),
}

impl<'m, B: EngineBackend> Engine<'m, B> {
    /// An engine over `model` with the pool `kv`.
    pub fn new(
        model: &'m LlamaModel<B>,
        kv: PagedKv<B>,
        config: SchedulerConfig,
        policy: PolicyKind,
    ) -> Self {
        let config = SchedulerConfig {
            max_seq_len: model.config.max_seq_len,
            ..config
        };
        Self {
            model,
            kv,
            sched: Scheduler::new(config, policy),
            decoding: HashMap::new(),
            steps: 0,
            tokens_computed: 0,
            last_batch: (0, 0),
        }
    }

    /// Turns on the prefix cache: requests reuse the cached KV blocks of the prompt
    /// prefixes they share with earlier ones. Keys are salted with the model's
    /// hyper-parameters; only FP32 blocks are indexed.
    pub fn with_prefix_cache(mut self) -> Self {
        use std::hash::{DefaultHasher, Hash, Hasher};
        let mut h = DefaultHasher::new();
        format!("{:?}", self.model.config).hash(&mut h);
        self.kv
            .pool
            .enable_prefix_cache(crate::prefix::PrefixIndex::new(h.finish()));
        self
    }

    /// Queues a request; one that could never run is refused here.
    pub fn submit(&mut self, request: Request) -> Result<RequestId, SubmitError> {
        let vocab = self.model.config.vocab_size;
        if let Some(&bad) = request.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(SubmitError::BadToken { token: bad, vocab });
        }
        let id = self
            .sched
            .submit(request.prompt, request.max_tokens, request.qos, &self.kv)?;
        self.decoding.insert(
            id,
            Decoding {
                sampler: Sampler::new(request.sampling),
                stop_ids: request.stop_ids,
            },
        );
        Ok(id)
    }

    /// Cancels a request at any time; its blocks return to the pool at once. `false` if
    /// it was not in flight.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        self.decoding.remove(&id);
        self.sched.remove(id, &mut self.kv).is_some()
    }

    /// Whether no request is in flight.
    pub fn is_idle(&self) -> bool {
        self.sched.is_empty()
    }

    /// Requests admitted to run (holding KV blocks) and requests waiting.
    pub fn load(&self) -> (usize, usize) {
        let running = self.sched.running();
        (running, self.sched.len() - running)
    }

    /// The KV pool's figures.
    pub fn kv_stats(&self) -> KvStats {
        self.kv.stats()
    }

    /// Runs one step: plans the batch, runs it through the model, samples the requests
    /// whose context is complete.
    pub fn step(&mut self) -> Result<Vec<Event>, ModelError> {
        let plan = self.sched.plan(&mut self.kv);
        let mut events = Vec::new();
        if plan.batch.is_empty() {
            return Ok(events);
        }
        let parts: Vec<SeqTokens<'_>> = plan
            .batch
            .iter()
            .map(|s| SeqTokens {
                seq: s.seq,
                tokens: &s.tokens,
            })
            .collect();
        let logits = self
            .model
            .forward_batch(&parts, &mut self.kv, Logits::Last)?;
        self.steps += 1;
        self.tokens_computed += plan.tokens() as u64;
        self.last_batch = (plan.batch.len(), plan.tokens());

        // Only the rows that sample are picked, on the device where the backend can (one
        // id read back per row).
        let rows: Vec<i64> = (0..plan.batch.len())
            .filter(|&i| plan.batch[i].samples)
            .map(|i| i as i64)
            .collect();
        let mut tokens = Vec::new();
        if !rows.is_empty() {
            let idx = Tensor::<B, 1, Int>::from_data(
                TensorData::new(rows.clone(), [rows.len()]),
                &self.model.device(),
            );
            let ids: Vec<_> = rows.iter().map(|&i| plan.batch[i as usize].id).collect();
            let mut by_id: HashMap<RequestId, &mut Sampler> = self
                .decoding
                .iter_mut()
                .filter(|(id, _)| ids.contains(id))
                .map(|(id, d)| (*id, &mut d.sampler))
                .collect();
            let mut samplers: Vec<&mut Sampler> = ids
                .iter()
                .map(|id| by_id.remove(id).expect("in flight"))
                .collect();
            tokens = pick_rows(logits.select(0, idx), &mut samplers);
        }
        let mut row = 0;
        for s in &plan.batch {
            let mut sampled = None;
            if s.samples {
                let token = tokens[row];
                row += 1;
                sampled = Some(token);
                events.push(Event::Token { id: s.id, token });
            }
            let stop = &self.decoding[&s.id].stop_ids;
            let finished = self.sched.complete(s, sampled, stop);
            if let Some(r) = self.sched.get(s.id) {
                self.kv
                    .index_prefix(s.seq, &r.tokens[..r.computed], finished.is_some());
            }
            if let Some(reason) = finished {
                self.decoding.remove(&s.id);
                self.sched.remove(s.id, &mut self.kv);
                events.push(Event::Finished { id: s.id, reason });
            }
        }
        Ok(events)
    }
}
