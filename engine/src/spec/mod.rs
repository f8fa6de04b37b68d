//! Speculative decoding: a proposer drafts a few tokens per decoding request, the model
//! scores them all in the step's one forward pass, the longest prefix the model's own
//! choice agrees with is kept, and the keys and values of the rest are taken back.
//!
//! Proposals are deterministic (one token per position), so the standard rejection rule
//! reduces to drawing the model's token at each drafted position with the request's own
//! sampler and keeping the draft while it agrees (see [`verify`]): greedy output is that
//! of plain decoding, and seeded sampling draws the same numbers in the same order.

mod acceptance;
mod ngram;
mod self_draft;
#[cfg(test)]
mod tests;
mod verify;

use std::fmt;
use std::str::FromStr;

pub use acceptance::Acceptance;
pub use ngram::NgramProposer;
pub use self_draft::SelfDraft;
pub use verify::{sampler_chain, verify, Verdict};

use crate::kv::{PagedKv, SeqId};
use crate::model::{Model, ModelConfig};
use crate::EngineBackend;

/// Which proposer drafts tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProposerKind {
    /// Prompt lookup: the tokens that followed the last n-gram where it occurred before.
    Ngram,
    /// The model's first layers and its output layer.
    SelfDraft,
}

impl FromStr for ProposerKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ngram" => Ok(Self::Ngram),
            "draft" | "self-draft" => Ok(Self::SelfDraft),
            _ => Err(format!("unknown proposer {s:?} (expected ngram or draft)")),
        }
    }
}

impl fmt::Display for ProposerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ngram => "ngram",
            Self::SelfDraft => "draft",
        })
    }
}

/// Speculation settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecConfig {
    pub proposer: ProposerKind,
    /// Tokens drafted per request and step at most (`--spec-tokens`).
    pub tokens: usize,
    /// Layers of the self-draft (`--spec-draft-layers`).
    pub draft_layers: usize,
}

impl SpecConfig {
    /// The proposer these settings name.
    pub fn proposer<B: EngineBackend>(&self) -> Box<dyn Proposer<B>> {
        match self.proposer {
            ProposerKind::Ngram => Box::new(NgramProposer::default()),
            ProposerKind::SelfDraft => Box::new(SelfDraft {
                layers: self.draft_layers,
            }),
        }
    }
}

/// One request to draft for: its tokens (all but the last are in `seq`'s cache).
#[derive(Debug, Clone, Copy)]
pub struct DraftRequest<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    /// Tokens to draft at most.
    pub max: usize,
}

/// Drafts tokens for decoding requests.
pub trait Proposer<B: EngineBackend>: Send {
    /// Up to `max` tokens continuing each request's `tokens` (possibly none). Leaves
    /// every sequence's cache as it found it.
    fn propose(
        &mut self,
        model: &Model<B>,
        kv: &mut PagedKv<B>,
        requests: &[DraftRequest<'_>],
    ) -> Vec<Vec<u32>>;

    /// What drafting one token costs, as a fraction of a one-token forward pass of a model
    /// with `config` (the acceptance rate below which drafting does not pay).
    fn draft_cost(&self, config: &ModelConfig) -> f32;
}

/// Counters of speculation since the engine started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Drafted tokens that went into a verification pass.
    pub proposed: u64,
    /// Drafted tokens kept.
    pub accepted: u64,
    /// Verifications (a request's drafted tokens scored in one step).
    pub verifications: u64,
}

impl SpecStats {
    /// Kept drafted tokens over proposed ones (0 when none were proposed).
    pub fn acceptance_rate(&self) -> f64 {
        match self.proposed {
            0 => 0.0,
            p => self.accepted as f64 / p as f64,
        }
    }
}
