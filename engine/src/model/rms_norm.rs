//! RMSNorm: x / sqrt(mean(x^2) + eps) * weight.

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, Tensor};

/// Root-mean-square layer norm over the last dimension.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// Per-channel scale.
    pub weight: Param<Tensor<B, 1>>,
    /// Added to the mean square for stability.
    pub eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    /// Wraps a weight vector.
    pub fn new(weight: Tensor<B, 1>, eps: f64) -> Self {
        Self {
            weight: Param::from_tensor(weight),
            eps,
        }
    }

    /// Normalises `x` of shape `[tokens, d]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let rms = x
            .clone()
            .powi_scalar(2)
            .mean_dim(1)
            .add_scalar(self.eps)
            .sqrt();
        x.div(rms).mul(self.weight.val().unsqueeze())
    }
}
