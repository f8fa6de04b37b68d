//! Prompt lookup: no extra model, just the request's own tokens.

use super::{DraftRequest, Proposer};
use crate::kv::PagedKv;
use crate::model::LlamaModel;
use crate::EngineBackend;

/// Matches the last `n` tokens (longest `n` first) against the earlier ones and drafts
/// what followed their most recent occurrence: at most `n - 2` tokens (at least one), as a
/// short match is weak evidence. On `bench spec`'s repetitive cases this kept 80% of
/// drafted tokens against 63% with full-length drafts, and decoding went from 1.45-1.50x
/// to 1.49-1.53x of plain decoding (four alternated invocations each).
#[derive(Debug, Clone, Copy)]
pub struct NgramProposer {
    pub max_n: usize,
    pub min_n: usize,
}

impl Default for NgramProposer {
    /// Matches of up to 6 tokens: a longer match picks the right one of several earlier
    /// continuations (on `bench spec`'s repetitive cases 63% of drafted tokens were kept,
    /// against 54% with at most 3).
    fn default() -> Self {
        Self { max_n: 6, min_n: 2 }
    }
}

impl NgramProposer {
    /// Up to `max` tokens continuing `tokens`.
    pub fn lookup(&self, tokens: &[u32], max: usize) -> Vec<u32> {
        let len = tokens.len();
        for n in (self.min_n.max(1)..=self.max_n).rev() {
            if len <= n {
                continue;
            }
            let tail = &tokens[len - n..];
            if let Some(i) = (0..len - n).rev().find(|&i| &tokens[i..i + n] == tail) {
                let start = i + n;
                let take = max.min(n.saturating_sub(2).max(1));
                return tokens[start..(start + take).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

impl<B: EngineBackend> Proposer<B> for NgramProposer {
    fn propose(
        &mut self,
        _model: &LlamaModel<B>,
        _kv: &mut PagedKv<B>,
        requests: &[DraftRequest<'_>],
    ) -> Vec<Vec<u32>> {
        requests
            .iter()
            .map(|r| self.lookup(r.tokens, r.max))
            .collect()
    }
}
