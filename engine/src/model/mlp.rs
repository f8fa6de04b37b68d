//! Gated feed-forward: down(act(gate(x)) * up(x)), SwiGLU or GeGLU.

use crate::EngineBackend;
use burn_tensor::{backend::Backend, Tensor};

use super::{Activation, Joint, Linear};

/// The gated feed-forward layer of a block.
#[derive(Debug, Clone)]
pub struct Mlp<B: Backend> {
    /// Gate and up, rows interleaved where joined.
    pub gate_up: Joint<B>,
    pub down: Linear<B>,
    pub activation: Activation,
}

impl<B: EngineBackend> Mlp<B> {
    /// Applies the layer to `[tokens, d_model]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let [gate, up]: [Tensor<B, 2>; 2] = self
            .gate_up
            .forward(x)
            .try_into()
            .unwrap_or_else(|_| unreachable!("gate and up"));
        let gated = match self.activation {
            Activation::Silu => B::swiglu(gate, up),
            Activation::GeluTanh => B::geglu(gate, up),
        };
        self.down.forward(gated)
    }
}
