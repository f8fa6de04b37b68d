//! Self-speculation: the model's first layers plus its output layer draft greedily.

use super::{DraftRequest, Proposer};
use crate::kv::PagedKv;
use crate::model::{Model, ModelConfig, SeqTokens};
use crate::sampling::argmax_rows;
use crate::EngineBackend;

/// Drafts with the first `layers` blocks of the model itself. The draft reads the keys
/// and values the full model cached for those layers (they are the same computation);
/// what it writes for its own tokens is taken back before the verification writes them
/// again, so the cache is shared and nothing is kept twice.
#[derive(Debug, Clone, Copy)]
pub struct SelfDraft {
    pub layers: usize,
}

impl<B: EngineBackend> Proposer<B> for SelfDraft {
    fn propose(
        &mut self,
        model: &Model<B>,
        kv: &mut PagedKv<B>,
        requests: &[DraftRequest<'_>],
    ) -> Vec<Vec<u32>> {
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); requests.len()];
        let Ok(starts) = requests
            .iter()
            .map(|r| kv.len(r.seq))
            .collect::<Result<Vec<_>, _>>()
        else {
            return drafts;
        };
        let mut last: Vec<u32> = requests
            .iter()
            .map(|r| *r.tokens.last().expect("a request has tokens"))
            .collect();
        loop {
            let active: Vec<usize> = (0..requests.len())
                .filter(|&i| drafts[i].len() < requests[i].max)
                .collect();
            if active.is_empty() {
                break;
            }
            let batch: Vec<SeqTokens<'_>> = active
                .iter()
                .map(|&i| SeqTokens {
                    seq: requests[i].seq,
                    tokens: std::slice::from_ref(&last[i]),
                })
                .collect();
            for s in &batch {
                kv.hold(s.seq);
            }
            // No room for the draft's keys (or any other refusal) ends the draft early.
            let Ok(logits) = model.forward_batch_shallow(&batch, kv, self.layers) else {
                break;
            };
            for (&i, id) in active.iter().zip(argmax_rows(logits)) {
                drafts[i].push(id);
                last[i] = id;
            }
        }
        for (r, &start) in requests.iter().zip(&starts) {
            // Known sequences, shortened to where they were: cannot fail.
            kv.restore(r.seq, start).expect("drafted sequence");
        }
        drafts
    }

    /// The draft's layers and the output layer, against the whole model's: weights read
    /// and multiplied per token.
    fn draft_cost(&self, config: &ModelConfig) -> f32 {
        let layer = config.layer_weights() as f32;
        let head = config.head_weights() as f32;
        let layers = self.layers.min(config.n_layers) as f32;
        (layers * layer + head) / (config.n_layers as f32 * layer + head)
    }
}
