//! One pre-norm transformer block: attention and SwiGLU, each with a residual.

use crate::EngineBackend;
use burn_tensor::{backend::Backend, Tensor};

use super::{Attention, KvCache, Mlp, QkvTarget, RmsNorm, Rope, Rows};
use crate::kv::{PagedBatch, PagedKv};
use crate::quant::QuantMatrix;

/// A block's matrices as the fused kernels take them.
struct FusedWeights<'a, B: Backend> {
    qkv: &'a QuantMatrix<B>,
    o: &'a QuantMatrix<B>,
    gate_up: &'a QuantMatrix<B>,
    down: &'a QuantMatrix<B>,
}

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

    /// Runs the block on the rows of a ragged batch over the paged cache: as the fused
    /// kernels when the batch asks for them and the weights are joined, else operation
    /// by operation.
    pub fn forward_paged(
        &self,
        x: Tensor<B, 2>,
        rope: &Rope<B>,
        kv: &mut PagedKv<B>,
        batch: &PagedBatch<B>,
        layer: usize,
    ) -> Tensor<B, 2> {
        match self.fused_weights().filter(|_| batch.fused) {
            Some(w) => self.forward_fused(x, &w, rope, kv, batch, layer),
            None => self.residuals(x, |n| self.attn.forward_paged(n, rope, kv, batch, layer)),
        }
    }

    /// The block in seven operations (see [`FusedOps`]).
    fn forward_fused(
        &self,
        x: Tensor<B, 2>,
        w: &FusedWeights<'_, B>,
        rope: &Rope<B>,
        kv: &mut PagedKv<B>,
        batch: &PagedBatch<B>,
        layer: usize,
    ) -> Tensor<B, 2> {
        let shape = self.attn.paged_shape(x.dims()[1], batch);
        let to = QkvTarget {
            rope,
            store: &mut kv.store,
            layer,
            batch,
            shape,
        };
        let q = B::qkv_rope_kv(self.attn_norm.forward(x.clone()), w.qkv, to);
        let attended = B::paged_attention(q, kv.store.layer(layer), batch, shape);
        let h = B::matmul_residual(attended, w.o, x);
        let gated = B::gate_up_swiglu(self.ffn_norm.forward(h.clone()), w.gate_up);
        B::matmul_residual(gated, w.down, h)
    }

    /// The matrices as the fused kernels take them, if they are joined and quantized.
    fn fused_weights(&self) -> Option<FusedWeights<'_, B>> {
        let (qkv, Rows::Stacked) = self.attn.qkv.joined()? else {
            return None;
        };
        let (gate_up, Rows::Interleaved) = self.mlp.gate_up.joined()? else {
            return None;
        };
        Some(FusedWeights {
            qkv,
            o: self.attn.o.quant()?,
            gate_up,
            down: self.mlp.down.quant()?,
        })
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
