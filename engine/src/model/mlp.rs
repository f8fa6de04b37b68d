//! SwiGLU feed-forward: down(silu(gate(x)) * up(x)).

use crate::EngineBackend;
use burn::tensor::{backend::Backend, Tensor};

use super::Linear;

/// The gated feed-forward layer of a Llama block.
#[derive(Debug, Clone)]
pub struct Mlp<B: Backend> {
    pub gate: Linear<B>,
    pub up: Linear<B>,
    pub down: Linear<B>,
}

impl<B: EngineBackend> Mlp<B> {
    /// Applies the layer to `[tokens, d_model]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let [gate, up] = Linear::forward_many(x, [&self.gate, &self.up]);
        self.down.forward(B::swiglu(gate, up))
    }
}
