//! SwiGLU feed-forward: down(silu(gate(x)) * up(x)).

use crate::EngineBackend;
use burn_tensor::{backend::Backend, Tensor};

use super::{Joint, Linear};

/// The gated feed-forward layer of a Llama block.
#[derive(Debug, Clone)]
pub struct Mlp<B: Backend> {
    /// Gate and up, rows interleaved where joined.
    pub gate_up: Joint<B>,
    pub down: Linear<B>,
}

impl<B: EngineBackend> Mlp<B> {
    /// Applies the layer to `[tokens, d_model]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let [gate, up]: [Tensor<B, 2>; 2] = self
            .gate_up
            .forward(x)
            .try_into()
            .unwrap_or_else(|_| unreachable!("gate and up"));
        self.down.forward(B::swiglu(gate, up))
    }
}
