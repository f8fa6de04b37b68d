//! Contiguous per-layer key/value cache, so decoding never recomputes past tokens.

use burn_tensor::{backend::Backend, Tensor};

/// Keys and values of one sequence for every layer, each `[kv_heads, tokens, head_dim]`.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    layers: Vec<Option<(Tensor<B, 3>, Tensor<B, 3>)>>,
    len: usize,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for `n_layers` layers.
    pub fn new(n_layers: usize) -> Self {
        Self {
            layers: vec![None; n_layers],
            len: 0,
        }
    }

    /// Tokens stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is stored yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `k`, `v` for `layer` and returns the layer's full keys and values.
    pub fn append(
        &mut self,
        layer: usize,
        k: Tensor<B, 3>,
        v: Tensor<B, 3>,
    ) -> (Tensor<B, 3>, Tensor<B, 3>) {
        let full = match self.layers[layer].take() {
            Some((pk, pv)) => (Tensor::cat(vec![pk, k], 1), Tensor::cat(vec![pv, v], 1)),
            None => (k, v),
        };
        self.layers[layer] = Some(full.clone());
        full
    }

    /// Records that `n` new tokens were appended to every layer.
    pub fn advance(&mut self, n: usize) {
        self.len += n;
    }
}
