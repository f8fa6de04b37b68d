//! Grouped-query self-attention with RoPE, computed in f32, over either the contiguous
//! cache of one sequence or the paged cache of a ragged batch; optionally with RMSNorm on
//! each query and key head and a sliding window.

use crate::EngineBackend;
use burn_tensor::{activation::softmax, backend::Backend, DType, Tensor, TensorData};

use super::{Joint, KvCache, LayerOps, Linear, RmsNorm, Rope};
use crate::kv::{AttentionShape, PagedBatch, PagedKv};

/// Attention projections of one block.
#[derive(Debug, Clone)]
pub struct Attention<B: Backend> {
    /// Q, K and V, stacked in that order where joined.
    pub qkv: Joint<B>,
    pub o: Linear<B>,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// RMSNorm over each query head, then each key head, before RoPE (Gemma 3, Qwen3).
    pub head_norms: Option<(RmsNorm<B>, RmsNorm<B>)>,
    /// The biases of Q, K and V (Qwen2), end to end as the joined product's columns.
    pub bias: Option<Tensor<B, 1>>,
    /// Keys a query sees, itself included (`None`: every earlier key).
    pub window: Option<usize>,
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
        let tokens = x.dims()[0];
        let heads =
            |t: Tensor<B, 2>, n: usize| t.reshape([tokens, n, self.head_dim]).swap_dims(0, 1);

        let [q, k, v] = self.project(x);
        let positions = Tensor::arange(start as i64..(start + tokens) as i64, &v.device());
        let q = B::rope_rows(q, self.n_heads, positions.clone(), rope);
        let k = heads(
            B::rope_rows(k, self.n_kv_heads, positions, rope),
            self.n_kv_heads,
        );
        let v = heads(v, self.n_kv_heads);
        let (k, v) = cache.append(layer, k, v);
        self.o.forward(B::contiguous_attention(
            q,
            k,
            v,
            start,
            self.n_heads,
            self.window,
        ))
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
        let batch = batch.for_layer(kv.is_sliding(layer));
        let shape = self.paged_shape(batch);
        let [q, k, v] = self.project(x);
        let q = B::rope_rows(q, self.n_heads, batch.positions.clone(), rope);
        let k = B::rope_rows(k, self.n_kv_heads, batch.positions.clone(), rope);
        kv.store_mut(layer)
            .write(layer, batch.write_rows.clone(), k, v);
        self.o.forward(B::paged_attention(
            q,
            kv.store(layer).layer(layer),
            batch,
            shape,
        ))
    }

    /// The shape of this layer's attention over `batch`.
    pub(crate) fn paged_shape(&self, batch: &PagedBatch<B>) -> AttentionShape {
        AttentionShape {
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            max_blocks: batch.max_blocks,
            window: self.window,
        }
    }

    /// Q, K and V of `x`, with their biases, the head norms applied to Q and K.
    fn project(&self, x: Tensor<B, 2>) -> [Tensor<B, 2>; 3] {
        let [q, k, v]: [Tensor<B, 2>; 3] = self
            .qkv
            .forward(x)
            .try_into()
            .unwrap_or_else(|_| unreachable!("Q, K and V"));
        let [q, k, v] = match &self.bias {
            Some(bias) => {
                let (qw, kw) = (q.dims()[1], k.dims()[1]);
                let add = |t: Tensor<B, 2>, from: usize, width: usize| {
                    t + bias.clone().slice(from..from + width).unsqueeze_dim(0)
                };
                [add(q, 0, qw), add(k, qw, kw), add(v, qw + kw, kw)]
            }
            None => [q, k, v],
        };
        match &self.head_norms {
            Some((qn, kn)) => [
                per_head(qn, q, self.n_heads),
                per_head(kn, k, self.n_kv_heads),
                v,
            ],
            None => [q, k, v],
        }
    }
}

/// `norm` over each of the `heads` heads of every row of `x` `[rows, heads * head_dim]`.
pub(crate) fn per_head<B: LayerOps>(
    norm: &RmsNorm<B>,
    x: Tensor<B, 2>,
    heads: usize,
) -> Tensor<B, 2> {
    let [rows, width] = x.dims();
    norm.forward(x.reshape([rows * heads, width / heads]))
        .reshape([rows, width])
}

/// Causal attention of queries `q` `[n_heads, tokens, hd]` (first at position `start`)
/// over keys and values `[n_kv_heads, start + tokens, hd]`, each query seeing at most
/// `window` keys (itself included) where given; returns `[tokens, n_heads * hd]`.
pub(crate) fn attend<B: Backend>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    start: usize,
    window: Option<usize>,
) -> Tensor<B, 2> {
    let [n_heads, tokens, head_dim] = q.dims();
    let [n_kv_heads, total, _] = k.dims();
    let group = n_heads / n_kv_heads;
    // Scores, softmax and sums in FP32 whatever the activations' float type.
    let dtype = q.dtype();
    let (q, k, v) = (q.cast(DType::F32), k.cast(DType::F32), v.cast(DType::F32));
    // Query heads sharing a kv head are stacked so one batched matmul serves the group.
    let q = q.reshape([n_kv_heads, group * tokens, head_dim]);
    let scale = (head_dim as f64).powf(-0.5);
    let mut scores = q.matmul(k.swap_dims(1, 2)).mul_scalar(scale);
    let windowed = window.is_some_and(|w| w < total);
    if tokens > 1 || windowed {
        let mask = causal_mask(group, tokens, start, total, window, &v.device());
        scores = scores.add(mask);
    }
    softmax(scores, 2)
        .matmul(v)
        .reshape([n_heads, tokens, head_dim])
        .swap_dims(0, 1)
        .reshape([tokens, n_heads * head_dim])
        .cast(dtype)
}

/// Additive mask `[1, group * tokens, total]`: row `g * tokens + i` (query at `start + i`)
/// sees keys `0..=start + i`, the last `window` of them where given.
fn causal_mask<B: Backend>(
    group: usize,
    tokens: usize,
    start: usize,
    total: usize,
    window: Option<usize>,
    device: &B::Device,
) -> Tensor<B, 3> {
    let mut mask = vec![0.0f32; group * tokens * total];
    for g in 0..group {
        for i in 0..tokens {
            let row = (g * tokens + i) * total;
            let end = start + i + 1;
            let first = window.map_or(0, |w| end.saturating_sub(w));
            mask[row..row + first].fill(f32::NEG_INFINITY);
            mask[row + end..row + total].fill(f32::NEG_INFINITY);
        }
    }
    Tensor::from_data(
        TensorData::new(mask, [1, group * tokens, total]),
        (device, DType::F32),
    )
}
