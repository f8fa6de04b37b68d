//! The step loop: requests in, one forward pass over the scheduler's ragged batch per
//! step, sampled tokens out. Thread-free; a caller drives [`Engine::step`].

use std::collections::HashMap;
use std::ops::Range;

use burn_tensor::Tensor;

use crate::grammar::Constraint;
use crate::kv::{BlockValues, KvStats, PagedKv, BLOCK_TOKENS};
use crate::model::{Logits, Model, ModelError, SeqTokens};
use crate::sampling::{
    pick_rows_hosted, select_rows, History, HostRow, Sampler, SamplingParams, TokenLogprobs,
};
use crate::sched::{
    FinishReason, PolicyKind, RequestId, Scheduled, Scheduler, SchedulerConfig, SubmitError,
};
use crate::spec::{
    sampler_chain, verify, Acceptance, DraftRequest, Proposer, SpecConfig, SpecStats, Verdict,
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
    /// The grammar the output must match (see [`crate::grammar`]): each step samples
    /// only tokens it allows, and the request ends when it is complete.
    pub constraint: Option<Constraint>,
    /// `Some(n)`: report each token's log-probability and the `n` most likely tokens'
    /// (at most [`crate::sampling::MAX_TOP_LOGPROBS`]).
    pub logprobs: Option<usize>,
    /// `Some(n)`: report the log-probability of each prompt token after the first, given
    /// those before it, with the `n` most likely tokens' at that position. Its prompt is
    /// then computed in full, [`PROMPT_SCORE_CHUNK`] tokens a step (no prefix cache).
    pub prompt_logprobs: Option<usize>,
}

/// Prompt positions a request with `prompt_logprobs` computes per step: the rows of
/// logits read back for it (`[rows, vocab]` floats).
pub const PROMPT_SCORE_CHUNK: usize = 128;

/// What a step produced for a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A new token, with its log-probabilities where the request asked for them.
    Token {
        id: RequestId,
        token: u32,
        logprobs: Option<Box<TokenLogprobs>>,
    },
    /// Log-probabilities of prompt tokens, continuing those reported before (the first
    /// covers the prompt's second token); all come before the request's first token.
    PromptLogprobs {
        id: RequestId,
        logprobs: Vec<TokenLogprobs>,
    },
    /// The request is done and its blocks are back in the pool.
    Finished { id: RequestId, reason: FinishReason },
}

/// Per-request sampling state.
struct Decoding {
    sampler: Sampler,
    stop_ids: Vec<u32>,
    acceptance: Acceptance,
    constraint: Option<Constraint>,
    /// The tokens seen, for the sampler's penalties.
    history: History,
    logprobs: Option<usize>,
    /// Top tokens per prompt position (`prompt_logprobs`), and the next prompt token whose
    /// log-probability is to be reported.
    prompt_logprobs: Option<usize>,
    scored: usize,
    /// Whether this step's draft is its grammar's forced tokens (not speculation).
    forced_draft: bool,
}

impl Decoding {
    /// Whether its tokens are chosen on the host.
    fn hosted(&self) -> bool {
        self.constraint.is_some() || self.logprobs.is_some() || self.sampler.needs_host()
    }

    /// Whether it may speculate: not hosted, or hosted for its grammar only (the matcher
    /// checks its drafts, and each drafted row is sampled under the mask after the draft
    /// tokens before it). Penalties and log-probabilities take one token at a time.
    fn speculates(&self) -> bool {
        self.logprobs.is_none() && !self.sampler.needs_host()
    }
}

/// Speculative decoding as the engine runs it.
struct Speculation<B: EngineBackend> {
    config: SpecConfig,
    proposer: Box<dyn Proposer<B>>,
    /// The proposer's cost per drafted token, as a fraction of a decoding step.
    draft_cost: f32,
}

/// A model, its KV pool and the scheduler.
pub struct Engine<'m, B: EngineBackend> {
    model: &'m Model<B>,
    pub kv: PagedKv<B>,
    pub sched: Scheduler,
    decoding: HashMap<RequestId, Decoding>,
    /// Steps run and tokens computed in them.
    pub steps: u64,
    pub tokens_computed: u64,
    /// Sequences and tokens of the last step's batch.
    pub last_batch: (usize, usize),
    speculation: Option<Speculation<B>>,
    /// Speculation's counters.
    pub spec_stats: SpecStats,
    /// Whether a grammar's forced tokens are written without sampling (on by default).
    force_tokens: bool,
    /// Tokens written so.
    pub forced_tokens: u64,
    /// Whether a row that needs only its grammar's mask is masked on the device (on by
    /// default; see [`crate::sampling::mask_rows`]).
    device_masks: bool,
}

impl<'m, B: EngineBackend> Engine<'m, B> {
    /// An engine over `model` with the pool `kv`.
    pub fn new(
        model: &'m Model<B>,
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
            speculation: None,
            spec_stats: SpecStats::default(),
            force_tokens: true,
            forced_tokens: 0,
            device_masks: true,
        }
    }

    /// Samples every token of a constrained request, even those its grammar forces
    /// (which are otherwise written without sampling, several in one pass).
    pub fn without_forced_tokens(mut self) -> Self {
        self.force_tokens = false;
        self
    }

    /// Reads every masked row back and masks it on the host (as rows with penalties or
    /// log-probabilities are), instead of sending the mask to the device.
    pub fn with_host_masks(mut self) -> Self {
        self.device_masks = false;
        self
    }

    /// Turns on speculative decoding: each step, decoding requests draft up to
    /// `config.tokens` tokens with the configured proposer, verified in the step's pass.
    pub fn with_speculation(mut self, config: SpecConfig) -> Self {
        if config.tokens > 0 {
            let proposer = config.proposer();
            self.speculation = Some(Speculation {
                draft_cost: proposer.draft_cost(&self.model.config),
                proposer,
                config,
            });
        }
        self
    }

    /// The speculation settings, if it is on.
    pub fn speculation(&self) -> Option<SpecConfig> {
        self.speculation.as_ref().map(|s| s.config)
    }

    /// Turns on the prefix cache: requests reuse the cached KV blocks of the prompt
    /// prefixes they share with earlier ones. Keys are salted with the model's
    /// hyper-parameters; only FP32 blocks are indexed.
    pub fn with_prefix_cache(mut self) -> Self {
        use std::hash::{DefaultHasher, Hash, Hasher};
        let mut h = DefaultHasher::new();
        format!("{:?}", self.model.config).hash(&mut h);
        self.kv.enable_prefix_cache(h.finish());
        self
    }

    /// Queues a request; one that could never run is refused here.
    pub fn submit(&mut self, request: Request) -> Result<RequestId, SubmitError> {
        let vocab = self.model.config.vocab_size;
        if let Some(&bad) = request.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(SubmitError::BadToken { token: bad, vocab });
        }
        let history = History::new(&request.prompt, &request.sampling.adjust);
        let id = self
            .sched
            .submit(request.prompt, request.max_tokens, request.qos, &self.kv)?;
        self.decoding.insert(
            id,
            Decoding {
                history,
                logprobs: request
                    .logprobs
                    .map(|n| n.min(crate::sampling::MAX_TOP_LOGPROBS)),
                sampler: Sampler::new(request.sampling),
                stop_ids: request.stop_ids,
                acceptance: Acceptance::new(
                    self.speculation.as_ref().map_or(0.0, |s| s.draft_cost),
                ),
                constraint: request.constraint,
                prompt_logprobs: request
                    .prompt_logprobs
                    .map(|n| n.min(crate::sampling::MAX_TOP_LOGPROBS)),
                scored: 1,
                forced_draft: false,
            },
        );
        if request.prompt_logprobs.is_some() {
            self.sched.compute_whole_prompt(id, PROMPT_SCORE_CHUNK);
        }
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

    /// Drafts for the requests that decode next (their context computed but the last
    /// token) and have at least two tokens to go: the tokens a grammar forces (with
    /// forcing on), and the proposer's drafts (with speculation on) for the others, a
    /// constrained request's cut where its grammar refuses a token.
    fn propose(&mut self) -> HashMap<RequestId, Vec<u32>> {
        let mut drafts = HashMap::new();
        let mut ids = Vec::new();
        let mut requests = Vec::new();
        for r in self.sched.entries() {
            let Some(seq) = r.seq else { continue };
            let to_go = r.max_tokens - r.generated();
            if r.pending() != 1 || to_go < 2 {
                continue;
            }
            // The pass's rows all see the tiers of its first row's length: a draft stops
            // short of the next length at which a block ages, where decoding token by
            // token would read that block in its new tier.
            let start = r.tokens.len() - 1;
            let before_ageing = self
                .kv
                .pool
                .policy()
                .next_change(start)
                .map_or(usize::MAX, |t| t - start - 1);
            let longest = (to_go - 1).min(before_ageing);
            let decoding = self.decoding.get_mut(&r.id).expect("in flight");
            decoding.forced_draft = false;
            // A grammar's forced tokens first (a request with log-probabilities samples
            // every token).
            let forcing = self.force_tokens && decoding.logprobs.is_none();
            if let Some(c) = decoding.constraint.as_mut().filter(|_| forcing) {
                let mut forced = c.forced();
                forced.truncate(longest);
                if !forced.is_empty() {
                    decoding.forced_draft = true;
                    drafts.insert(r.id, forced);
                    continue;
                }
            }
            if !decoding.speculates() {
                continue;
            }
            let Some(spec) = self.speculation.as_ref() else {
                continue;
            };
            if !decoding.acceptance.wants_draft() {
                continue;
            }
            let max = decoding
                .acceptance
                .draft_len(spec.config.tokens.min(to_go - 1))
                .min(before_ageing);
            if max == 0 {
                continue;
            }
            ids.push(r.id);
            requests.push(DraftRequest {
                seq,
                tokens: &r.tokens,
                max,
            });
        }
        if let (Some(spec), false) = (self.speculation.as_mut(), requests.is_empty()) {
            let proposed = spec.proposer.propose(self.model, &mut self.kv, &requests);
            for (id, mut draft) in ids.into_iter().zip(proposed) {
                // A constrained request's draft stops where its grammar refuses a token.
                let d = self.decoding.get_mut(&id).expect("in flight");
                if let Some(c) = d.constraint.as_mut() {
                    draft.truncate(c.valid_prefix(&draft));
                }
                if !draft.is_empty() {
                    drafts.insert(id, draft);
                }
            }
        }
        drafts
    }

    /// Runs one step: drafts (with speculation on), plans the batch, runs it through the
    /// model, samples the requests whose context is complete and verifies their drafts.
    pub fn step(&mut self) -> Result<Vec<Event>, ModelError> {
        let drafts = self.propose();
        let plan = self.sched.plan_with_drafts(&mut self.kv, &drafts);
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
        // A step that completes a block gives the pool the sequence's ids, so its full
        // blocks are indexed before they can age (prompts longer than the FP32 window).
        if self.kv.pool.prefix_stats().is_some() {
            for s in plan.batch.iter().filter(|s| s.drafted == 0) {
                let Some(r) = self.sched.get(s.id) else {
                    continue;
                };
                let end = r.computed + s.tokens.len();
                if end / BLOCK_TOKENS > r.computed / BLOCK_TOKENS && end <= r.tokens.len() {
                    self.kv.stage_tokens(s.seq, r.tokens[..end].to_vec());
                }
            }
        }
        let speculating = plan.batch.iter().any(|s| s.drafted > 0);
        let scored: Vec<Range<usize>> = plan.batch.iter().map(|s| self.scored(s)).collect();
        let scoring = scored.iter().any(|t| !t.is_empty());
        // Rows of logits per sequence: its prompt positions scored, or its drafted ones
        // and the one after (the sampled row is the last either way).
        let tails: Vec<usize> = plan
            .batch
            .iter()
            .zip(&scored)
            .map(|(s, t)| match t.is_empty() {
                true => 1 + s.drafted,
                false => t.len() + usize::from(s.samples),
            })
            .collect();
        let logits = if speculating || scoring {
            for s in plan.batch.iter().filter(|s| s.drafted > 0) {
                self.kv.hold(s.seq);
            }
            let run = self.model.forward_batch_tails(&parts, &mut self.kv, &tails);
            if run.is_err() {
                for s in plan.batch.iter().filter(|s| s.drafted > 0) {
                    let len = self.kv.len(s.seq)?;
                    self.kv.restore(s.seq, len)?;
                }
            }
            run?
        } else {
            self.model
                .forward_batch(&parts, &mut self.kv, Logits::Last)?
        };
        self.steps += 1;
        self.tokens_computed += plan.tokens() as u64;
        self.last_batch = (plan.batch.len(), plan.tokens());

        let (logits, mut prompt_logprobs) = match scoring {
            true => self.score_prompts(&plan.batch, logits, &scored, &tails),
            false => (logits, Vec::new()),
        };
        let picks = self.pick(&plan.batch, logits);
        for (i, (s, picks)) in plan.batch.iter().zip(picks).enumerate() {
            if let Some(logprobs) = prompt_logprobs.get_mut(i).and_then(Option::take) {
                events.push(Event::PromptLogprobs { id: s.id, logprobs });
            }
            let (picks, mut logprobs) = match picks {
                Some((p, l)) => (Some(p), l),
                None => (None, None),
            };
            let verdict = picks.map(|p| verify(s.draft(), &p));
            let mut finished = None;
            if let Some(Verdict { tokens, accepted }) = &verdict {
                let d = self.decoding.get_mut(&s.id).expect("in flight");
                let stop = &d.stop_ids;
                let (taken, reason) = self.sched.complete_verified(s, *accepted, tokens, stop);
                finished = reason;
                d.history.extend(&tokens[..taken]);
                if let (Some(c), None) = (d.constraint.as_mut(), finished) {
                    finished = match c.consume(&tokens[..taken]) {
                        Err(e) => {
                            tracing::warn!(request = s.id.0, "{e}");
                            Some(FinishReason::GrammarFailed)
                        }
                        Ok(()) => c.is_finished().then_some(FinishReason::Stop),
                    };
                }
                // The request's generator moves past the draws its emitted tokens used.
                for _ in 0..tokens.len() {
                    d.sampler.draw();
                }
                if s.drafted > 0 {
                    if d.forced_draft {
                        self.forced_tokens += *accepted as u64;
                    } else {
                        d.acceptance.record(s.drafted, *accepted, plan.batch.len());
                        self.spec_stats.proposed += s.drafted as u64;
                        self.spec_stats.accepted += *accepted as u64;
                        self.spec_stats.verifications += 1;
                    }
                    // The rejected drafted tokens' keys and values are taken back.
                    let len = self.kv.len(s.seq)? - (s.drafted - accepted);
                    self.kv.truncate(s.seq, len)?;
                    self.kv.settle(s.seq)?;
                }
                // A request with logprobs takes one token a step (no draft): they are its.
                events.extend(tokens[..taken].iter().map(|&token| Event::Token {
                    id: s.id,
                    token,
                    logprobs: logprobs.take().map(Box::new),
                }));
            } else {
                self.sched.complete(s, None, &[]);
            }
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

    /// Puts blocks of `prompt` brought from a tier shared with other engines (its full
    /// blocks from block `first` on, in order, verified against its tokens) where
    /// admitting it finds them: the host tier. Returns the blocks taken.
    pub fn import_prefix(
        &mut self,
        prompt: &[u32],
        first: usize,
        blocks: Vec<BlockValues>,
    ) -> usize {
        self.kv.pool.import_to_host(prompt, first, blocks)
    }

    /// The indices of the prompt tokens whose log-probabilities `s`'s pass gives (its rows
    /// predict the tokens after its own), for a request that asked for them.
    fn scored(&self, s: &Scheduled) -> Range<usize> {
        let (Some(d), Some(r)) = (self.decoding.get(&s.id), self.sched.get(s.id)) else {
            return 0..0;
        };
        if d.prompt_logprobs.is_none() {
            return 0..0;
        }
        let first = d.scored.max(r.computed + 1);
        first
            ..(r.computed + s.tokens.len() + 1)
                .min(r.prompt_len)
                .max(first)
    }

    /// Splits the logits of a pass over `batch` with `tails[i]` rows per sequence: the
    /// prompt log-probabilities of the positions `scored[i]` (read back, one entry per
    /// sequence), and the last `1 + drafted` rows of each sequence, as [`Self::pick`]
    /// takes them.
    #[allow(clippy::type_complexity)]
    fn score_prompts(
        &mut self,
        batch: &[Scheduled],
        logits: Tensor<B, 2>,
        scored: &[Range<usize>],
        tails: &[usize],
    ) -> (Tensor<B, 2>, Vec<Option<Vec<TokenLogprobs>>>) {
        let (mut picked, mut read) = (Vec::new(), Vec::new());
        let mut at = 0;
        for ((s, t), &tail) in batch.iter().zip(scored).zip(tails) {
            picked.extend(at + tail - (1 + s.drafted).min(tail)..at + tail);
            read.extend(at..at + t.len());
            at += tail;
        }
        let vocab = self.model.config.vocab_size;
        let values = crate::logits_to_vec(select_rows(logits.clone(), &read));
        let mut rows = values.chunks_exact(vocab);
        let logprobs = batch
            .iter()
            .zip(scored)
            .map(|(s, t)| {
                if t.is_empty() {
                    return None;
                }
                let d = self.decoding.get_mut(&s.id).expect("in flight");
                let top = d.prompt_logprobs.unwrap_or(0);
                let tokens = &self.sched.get(s.id).expect("in flight").tokens;
                d.scored = t.end;
                let row = rows.by_ref().take(t.len());
                Some(
                    row.zip(&tokens[t.clone()])
                        .map(|(row, &token)| TokenLogprobs::of(row, token, top))
                        .collect(),
                )
            })
            .collect();
        (select_rows(logits, &picked), logprobs)
    }

    /// The sampled tokens of each scheduled request that samples, one per logits row it
    /// has (`1 + drafted`, in batch order), each row drawn with the next draw of the
    /// request's generator; picked on the device where the backend can (one id read back
    /// per row), on the host for requests that need it ([`Decoding::hosted`]), with their
    /// log-probabilities where asked. A constrained request's rows are sampled under the
    /// masks after the drafted tokens before them; when its draft is the tokens its
    /// grammar forces, they are taken as they are and only its last row is sampled.
    #[allow(clippy::type_complexity)]
    fn pick(
        &mut self,
        batch: &[Scheduled],
        logits: Tensor<B, 2>,
    ) -> Vec<Option<(Vec<u32>, Option<TokenLogprobs>)>> {
        // The grammars' masks first (they advance the matchers' state), then the rows:
        // one per row the host samples (after forced tokens, the last row's only).
        let mut masks = HashMap::new();
        for s in batch.iter().filter(|s| s.samples) {
            let d = self.decoding.get_mut(&s.id).expect("in flight");
            // A mask that fails leaves the row free; consuming the token then fails the
            // request.
            let Some(c) = d.constraint.as_mut() else {
                continue;
            };
            let rows = match (s.drafted, d.forced_draft) {
                (0, _) => c.mask().map(|m| vec![m]),
                (_, true) => c.mask_after(s.draft()).map(|m| vec![m]),
                (_, false) => c.masks_along(s.draft()),
            };
            if let Ok(rows) = rows {
                masks.insert(s.id, rows.into_iter());
            }
        }
        let mut rows = Vec::new();
        let mut samplers = Vec::new();
        let mut hosted: Vec<Option<HostRow<'_>>> = Vec::new();
        // Per sampling request: the tokens taken as they are and the rows picked.
        let mut shapes = Vec::new();
        let mut row = 0;
        for s in batch {
            let n = 1 + s.drafted;
            if s.samples {
                let d = &self.decoding[&s.id];
                // Forced tokens are taken as they are: only the row after them samples.
                let (known, first) = match s.drafted > 0 && d.forced_draft {
                    true => (s.draft(), n - 1),
                    false => (&[][..], 0),
                };
                let chain = sampler_chain(&d.sampler, n).into_iter().skip(first);
                rows.extend(row + first..row + n);
                samplers.extend(chain);
                shapes.push((known, n - first));
                let mut row_masks = masks.remove(&s.id);
                hosted.extend((first..n).map(|_| {
                    d.hosted().then(|| HostRow {
                        mask: row_masks.as_mut().and_then(Iterator::next),
                        history: &d.history,
                        logprobs: d.logprobs,
                    })
                }));
            }
            row += n;
        }
        let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
        if !rows.is_empty() {
            let mut refs: Vec<&mut Sampler> = samplers.iter_mut().collect();
            // Every row samples (the usual case): no copy of the rows picked.
            let logits = match rows.len() == row {
                true => logits,
                false => select_rows(logits, &rows),
            };
            (tokens, logprobs) = pick_rows_hosted(logits, &mut refs, &hosted, self.device_masks);
        }
        let mut at = 0;
        let mut shapes = shapes.into_iter();
        batch
            .iter()
            .map(|s| {
                s.samples.then(|| {
                    let (known, n) = shapes.next().expect("one shape per sampling request");
                    at += n;
                    let mut picked = known.to_vec();
                    picked.extend_from_slice(&tokens[at - n..at]);
                    (picked, logprobs[at - 1].take())
                })
            })
            .collect()
    }
}
