//! SwiGLU feed-forward: down(silu(gate(x)) * up(x)).

use crate::EngineBackend;
use burn::tensor::{activation::silu, backend::Backend, Tensor};

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
        let gated = silu(self.gate.forward(x.clone())).mul(self.up.forward(x));
        self.down.forward(gated)
    }
}
