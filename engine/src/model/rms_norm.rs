//! RMSNorm: x / sqrt(mean(x^2) + eps) * weight.

use burn_tensor::{backend::Backend, Tensor};

use super::LayerOps;

/// Root-mean-square layer norm over the last dimension.
#[derive(Debug, Clone)]
pub struct RmsNorm<B: Backend> {
    /// Per-channel scale.
    pub weight: Tensor<B, 1>,
    /// Added to the mean square for stability.
    pub eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    /// Wraps a weight vector.
    pub fn new(weight: Tensor<B, 1>, eps: f64) -> Self {
        Self { weight, eps }
    }
}

impl<B: LayerOps> RmsNorm<B> {
    /// Normalises `x` of shape `[tokens, d]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        B::rms_norm(x, self.weight.clone(), self.eps)
    }
}
