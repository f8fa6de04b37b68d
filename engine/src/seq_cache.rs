//! One sequence's view of a KV cache, so generation and scoring run the same way over the
//! contiguous cache of the foundation and over a sequence of the paged pool.

use crate::EngineBackend;
use burn_tensor::{backend::Backend, Tensor};

use crate::kv::{PagedKv, SeqId};
use crate::model::{KvCache, Logits, Model, ModelError, SeqTokens};

/// A cache holding one sequence that the model can continue.
pub trait SeqCache<B: EngineBackend> {
    /// Tokens cached.
    fn cached(&self) -> usize;
    /// Runs `tokens` after the cached ones and returns logits for `logits` positions.
    fn forward(
        &mut self,
        model: &Model<B>,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Tensor<B, 2>, ModelError>;
}

impl<B: EngineBackend, C: SeqCache<B> + ?Sized> SeqCache<B> for &mut C {
    fn cached(&self) -> usize {
        (**self).cached()
    }

    fn forward(
        &mut self,
        model: &Model<B>,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Tensor<B, 2>, ModelError> {
        (**self).forward(model, tokens, logits)
    }
}

impl<B: EngineBackend> SeqCache<B> for KvCache<B> {
    fn cached(&self) -> usize {
        self.len()
    }

    fn forward(
        &mut self,
        model: &Model<B>,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Tensor<B, 2>, ModelError> {
        model.forward(tokens, self, logits)
    }
}

/// A sequence of a paged pool; freed when dropped.
#[derive(Debug)]
pub struct PagedSeq<'a, B: Backend> {
    pub kv: &'a mut PagedKv<B>,
    pub seq: SeqId,
    /// Sink blocks and window tokens kept before each forward pass (an elastic window
    /// held at one size).
    pub window: Option<(usize, usize)>,
}

impl<'a, B: Backend> PagedSeq<'a, B> {
    /// Registers a new sequence in `kv`.
    pub fn new(kv: &'a mut PagedKv<B>) -> Self {
        let seq = kv.add_sequence();
        Self {
            kv,
            seq,
            window: None,
        }
    }

    /// A sequence that, with `window` = `(sink_blocks, tokens)`, keeps before each forward
    /// pass only its first `sink_blocks` blocks and the blocks holding its newest `tokens`
    /// (with `None`, everything).
    pub fn with_window(kv: &'a mut PagedKv<B>, window: Option<(usize, usize)>) -> Self {
        let mut seq = Self::new(kv);
        seq.window = window;
        seq
    }
}

impl<B: Backend> Drop for PagedSeq<'_, B> {
    fn drop(&mut self) {
        let _ = self.kv.free_sequence(self.seq);
    }
}

impl<B: EngineBackend> SeqCache<B> for PagedSeq<'_, B> {
    fn cached(&self) -> usize {
        self.kv.len(self.seq).unwrap_or(0)
    }

    fn forward(
        &mut self,
        model: &Model<B>,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Tensor<B, 2>, ModelError> {
        if let Some((sink, window)) = self.window {
            self.kv.trim_window(self.seq, sink, window)?;
        }
        let batch = [SeqTokens {
            seq: self.seq,
            tokens,
        }];
        model.forward_batch(&batch, self.kv, logits)
    }
}
