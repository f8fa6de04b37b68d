//! Grouped-query self-attention with RoPE, computed in f32, over either the contiguous
//! cache of one sequence or the paged cache of a ragged batch.

use crate::EngineBackend;
use burn_tensor::{activation::softmax, backend::Backend, Tensor, TensorData};

use super::{Joint, KvCache, Linear, Rope};
use crate::kv::{AttentionShape, PagedBatch, PagedKv};

/// Attention projections of one block.
#[derive(Debug, Clone)]
pub struct Attention<B: Backend> {
    /// Q, K and V, stacked in that order where joined.
    pub qkv: Joint<B>,
    pub o: Linear<B>,
    pub n_heads: usize,
    pub n_kv_heads: usize,
}

impl<B: EngineBackend> Attention<B> {
    /// Attends `x` (`[tokens, d_model]`, first token at position `start`) over the cache
    /// of `layer`, appending this call's keys and values to it.
    pub fn forward(
        &self,
        x: Tensor<B, 2>,
        rope: &Rope<B>,
        cache: &mut KvCache<B>,
        layer: usize,
        start: usize,
    ) -> Tensor<B, 2> {
        let [tokens, d_model] = x.dims();
        let head_dim = d_model / self.n_heads;
        let heads = |t: Tensor<B, 2>, n: usize| t.reshape([tokens, n, head_dim]).swap_dims(0, 1);

        let [q, k, v] = self.project(x);
        let positions = Tensor::arange(start as i64..(start + tokens) as i64, &v.device());
        let q = B::rope_rows(q, self.n_heads, positions.clone(), rope);
        let k = heads(
            B::rope_rows(k, self.n_kv_heads, positions, rope),
            self.n_kv_heads,
        );
        let v = heads(v, self.n_kv_heads);
        let (k, v) = cache.append(layer, k, v);
        self.o
            .forward(B::contiguous_attention(q, k, v, start, self.n_heads))
    }

    /// Attends the rows of a ragged batch `x` (`[rows, d_model]`) over the paged cache of
    /// `layer`, writing this call's keys and values into it first.
    pub fn forward_paged(
        &self,
        x: Tensor<B, 2>,
        rope: &Rope<B>,
        kv: &mut PagedKv<B>,
        batch: &PagedBatch<B>,
        layer: usize,
    ) -> Tensor<B, 2> {
        let shape = self.paged_shape(x.dims()[1], batch);
        let [q, k, v] = self.project(x);
        let q = B::rope_rows(q, self.n_heads, batch.positions.clone(), rope);
        let k = B::rope_rows(k, self.n_kv_heads, batch.positions.clone(), rope);
        kv.store.write(layer, batch.write_rows.clone(), k, v);
        self.o
            .forward(B::paged_attention(q, kv.store.layer(layer), batch, shape))
    }

    /// The shape of this layer's attention over `batch` for inputs `d_model` wide.
    pub(crate) fn paged_shape(&self, d_model: usize, batch: &PagedBatch<B>) -> AttentionShape {
        AttentionShape {
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: d_model / self.n_heads,
            max_blocks: batch.max_blocks,
        }
    }

    /// Q, K and V of `x`.
    fn project(&self, x: Tensor<B, 2>) -> [Tensor<B, 2>; 3] {
        self.qkv
            .forward(x)
            .try_into()
            .unwrap_or_else(|_| unreachable!("Q, K and V"))
    }
}

/// Causal attention of queries `q` `[n_heads, tokens, hd]` (first at position `start`)
/// over keys and values `[n_kv_heads, start + tokens, hd]`; returns `[tokens, n_heads * hd]`.
pub(crate) fn attend<B: Backend>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    start: usize,
) -> Tensor<B, 2> {
    let [n_heads, tokens, head_dim] = q.dims();
    let [n_kv_heads, total, _] = k.dims();
    let group = n_heads / n_kv_heads;
    // Query heads sharing a kv head are stacked so one batched matmul serves the group.
    let q = q.reshape([n_kv_heads, group * tokens, head_dim]);
    let scale = (head_dim as f64).powf(-0.5);
    let mut scores = q.matmul(k.swap_dims(1, 2)).mul_scalar(scale);
    if tokens > 1 {
        scores = scores.add(causal_mask(group, tokens, start, total, &v.device()));
    }
    softmax(scores, 2)
        .matmul(v)
        .reshape([n_heads, tokens, head_dim])
        .swap_dims(0, 1)
        .reshape([tokens, n_heads * head_dim])
}

/// Additive mask `[1, group * tokens, total]`: row `g * tokens + i` (query at `start + i`)
/// sees keys `0..=start + i`.
fn causal_mask<B: Backend>(
    group: usize,
    tokens: usize,
    start: usize,
    total: usize,
    device: &B::Device,
) -> Tensor<B, 3> {
    let mut mask = vec![0.0f32; group * tokens * total];
    for g in 0..group {
        for i in 0..tokens {
            let row = (g * tokens + i) * total;
            mask[row + start + i + 1..row + total].fill(f32::NEG_INFINITY);
        }
    }
    Tensor::from_data(TensorData::new(mask, [1, group * tokens, total]), device)
}
