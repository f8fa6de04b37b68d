//! One pre-norm transformer block: attention and SwiGLU, each with a residual.

use crate::EngineBackend;
use burn::tensor::{backend::Backend, Tensor};

use super::{Attention, KvCache, Mlp, RmsNorm, Rope};
use crate::kv::{PagedBatch, PagedKv};

/// A Llama decoder block.
#[derive(Debug, Clone)]
pub struct Block<B: Backend> {
    pub attn_norm: RmsNorm<B>,
    pub attn: Attention<B>,
    pub ffn_norm: RmsNorm<B>,
    pub mlp: Mlp<B>,
}

impl<B: EngineBackend> Block<B> {
    /// Runs the block on `[tokens, d_model]` starting at position `start`.
    pub fn forward(
        &self,
        x: Tensor<B, 2>,
        rope: &Rope<B>,
        cache: &mut KvCache<B>,
        layer: usize,
        start: usize,
    ) -> Tensor<B, 2> {
        self.residuals(x, |n| self.attn.forward(n, rope, cache, layer, start))
    }

    /// Runs the block on the rows of a ragged batch over the paged cache.
    pub fn forward_paged(
        &self,
        x: Tensor<B, 2>,
        rope: &Rope<B>,
        kv: &mut PagedKv<B>,
        batch: &PagedBatch<B>,
        layer: usize,
    ) -> Tensor<B, 2> {
        self.residuals(x, |n| self.attn.forward_paged(n, rope, kv, batch, layer))
    }

    /// The block around its attention: `attend` gets the normed input.
    fn residuals(
        &self,
        x: Tensor<B, 2>,
        attend: impl FnOnce(Tensor<B, 2>) -> Tensor<B, 2>,
    ) -> Tensor<B, 2> {
        let h = x.clone() + attend(self.attn_norm.forward(x));
        h.clone() + self.mlp.forward(self.ffn_norm.forward(h))
    }
}
