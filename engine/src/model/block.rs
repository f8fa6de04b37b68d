//! One pre-norm transformer block: attention and the gated feed-forward layer, each with
//! a residual, and (Gemma) a norm on each one's output before its residual add.

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

/// A decoder block.
#[derive(Debug, Clone)]
pub struct Block<B: Backend> {
    pub attn_norm: RmsNorm<B>,
    pub attn: Attention<B>,
    pub ffn_norm: RmsNorm<B>,
    pub mlp: Mlp<B>,
    /// Norms of the attention and of the feed-forward output, before their residual adds.
    pub post_norms: Option<(RmsNorm<B>, RmsNorm<B>)>,
    /// The model's RoPE table this block rotates by.
    pub rope: usize,
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

    /// The block in seven operations (Llama's) or nine (Gemma's; see [`FusedOps`]).
    fn forward_fused(
        &self,
        x: Tensor<B, 2>,
        w: &FusedWeights<'_, B>,
        rope: &Rope<B>,
        kv: &mut PagedKv<B>,
        batch: &PagedBatch<B>,
        layer: usize,
    ) -> Tensor<B, 2> {
        let batch = batch.for_layer(kv.is_sliding(layer));
        let shape = self.attn.paged_shape(batch);
        let to = QkvTarget {
            bias: self.attn.bias.as_ref(),
            head_norms: self.attn.head_norms.as_ref(),
            rope,
            store: kv.store_mut(layer),
            layer,
            batch,
            shape,
        };
        let q = B::qkv_rope_kv(self.attn_norm.forward(x.clone()), w.qkv, to);
        let attended = B::paged_attention(q, kv.store(layer).layer(layer), batch, shape);
        let (h, normed) = match &self.post_norms {
            Some((after_attn, _)) => {
                let a = B::quant_matmul(attended, w.o);
                let (h, n) = B::norm_residual(a, after_attn, x, Some(&self.ffn_norm));
                (h, n.expect("the FFN's norm"))
            }
            None => {
                let h = B::matmul_residual(attended, w.o, x);
                (h.clone(), self.ffn_norm.forward(h))
            }
        };
        let gated = B::gate_up_gated(normed, w.gate_up, self.mlp.activation);
        match &self.post_norms {
            Some((_, after_ffn)) => {
                let f = B::quant_matmul(gated, w.down);
                B::norm_residual(f, after_ffn, h, None).0
            }
            None => B::matmul_residual(gated, w.down, h),
        }
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
        // The residual stream keeps its float type (FP32); the branches may not.
        let a = attend(self.attn_norm.forward(x.clone()));
        let a = match &self.post_norms {
            Some((after_attn, _)) => after_attn.forward(a),
            None => a,
        };
        let dtype = x.dtype();
        let h = x + a.cast(dtype);
        let f = self.mlp.forward(self.ffn_norm.forward(h.clone()));
        let f = match &self.post_norms {
            Some((_, after_ffn)) => after_ffn.forward(f),
            None => f,
        };
        h + f.cast(dtype)
    }
}
