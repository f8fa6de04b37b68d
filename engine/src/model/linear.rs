//! A bias-free linear layer with its weight stored `[in, out]` for `x @ w`.

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, Tensor};

/// `y = x @ weight`, no bias (Llama has none).
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    /// Weight of shape `[in, out]`.
    pub weight: Param<Tensor<B, 2>>,
}

impl<B: Backend> Linear<B> {
    /// Wraps a `[in, out]` weight.
    pub fn new(weight: Tensor<B, 2>) -> Self {
        Self {
            weight: Param::from_tensor(weight),
        }
    }

    /// Applies the layer to `x` of shape `[tokens, in]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        x.matmul(self.weight.val())
    }
}
