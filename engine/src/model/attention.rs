//! Grouped-query self-attention with RoPE over a contiguous KV cache, computed in f32.

use burn::module::Module;
use burn::tensor::{activation::softmax, backend::Backend, Tensor, TensorData};

use super::{KvCache, Linear, Rope};

/// Attention projections of one block.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    pub q: Linear<B>,
    pub k: Linear<B>,
    pub v: Linear<B>,
    pub o: Linear<B>,
    pub n_heads: usize,
    pub n_kv_heads: usize,
}

impl<B: Backend> Attention<B> {
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
        let group = self.n_heads / self.n_kv_heads;
        let heads = |t: Tensor<B, 2>, n: usize| t.reshape([tokens, n, head_dim]).swap_dims(0, 1);

        let q = rope.apply(heads(self.q.forward(x.clone()), self.n_heads), start);
        let k = rope.apply(heads(self.k.forward(x.clone()), self.n_kv_heads), start);
        let v = heads(self.v.forward(x), self.n_kv_heads);
        let (k, v) = cache.append(layer, k, v);
        let total = start + tokens;

        // Query heads sharing a kv head are stacked so one batched matmul serves the group.
        let q = q.reshape([self.n_kv_heads, group * tokens, head_dim]);
        let scale = (head_dim as f64).powf(-0.5);
        let mut scores = q.matmul(k.swap_dims(1, 2)).mul_scalar(scale);
        if tokens > 1 {
            scores = scores.add(causal_mask(group, tokens, start, total, &v.device()));
        }
        let probs = softmax(scores, 2);
        let out = probs
            .matmul(v)
            .reshape([self.n_heads, tokens, head_dim])
            .swap_dims(0, 1)
            .reshape([tokens, d_model]);
        self.o.forward(out)
    }
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
