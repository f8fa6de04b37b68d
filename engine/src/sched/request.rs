//! A request as the scheduler sees it.

use crate::kv::SeqId;

/// Identifies a submitted request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// Why a request finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// It generated `max_tokens` tokens.
    Length,
    /// It generated a stop token.
    Stop,
    /// It was cancelled.
    Cancelled,
    /// Its grammar failed to match (an error for the client, not an answer).
    GrammarFailed,
}

/// Why a request was refused at submission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("max_tokens must be at least 1")]
    NoTokensWanted,
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    BadToken { token: u32, vocab: usize },
    #[error("QoS class {0} is out of range (0 = interactive .. 3 = batch)")]
    BadQos(u8),
    #[error("prompt ({prompt} tokens) plus max_tokens ({max_tokens}) exceeds the model's context of {limit} tokens")]
    ContextOverflow {
        prompt: usize,
        max_tokens: usize,
        limit: usize,
    },
    #[error("prompt ({prompt} tokens) plus max_tokens ({max_tokens}) can never fit the KV pool of {capacity} tokens")]
    NeverFits {
        prompt: usize,
        max_tokens: usize,
        capacity: usize,
    },
}

/// Progress of one request.
#[derive(Debug, Clone)]
pub struct Entry {
    pub id: RequestId,
    /// QoS class: 0 interactive .. 3 batch.
    pub qos: u8,
    /// Submission order.
    pub arrival: u64,
    /// Scheduler step at submission.
    pub submitted_step: u64,
    /// The prompt, then every generated token.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub max_tokens: usize,
    /// Leading tokens whose KV is cached.
    pub computed: usize,
    /// Its KV sequence while it holds blocks.
    pub seq: Option<SeqId>,
    /// Times it was preempted.
    pub preemptions: u32,
    /// The most tokens it had computed when it was preempted (0 if never).
    pub lost: usize,
    /// `Some(n)`: every position of its prompt is computed (none taken from the prefix
    /// cache), at most `n` a step, because their logits are read (prompt log-probabilities).
    pub prompt_chunk: Option<usize>,
}

impl Entry {
    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Tokens still to compute before the next token can be sampled.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.computed
    }

    /// Tokens still to compute until the request is done (pending plus those to generate).
    pub fn remaining_work(&self) -> usize {
        self.pending() + self.max_tokens - self.generated()
    }

    /// The most tokens it will ever hold: prompt plus `max_tokens`.
    pub fn max_len(&self) -> usize {
        self.prompt_len + self.max_tokens
    }
}
