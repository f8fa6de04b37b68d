//! A bias-free linear layer whose weight is FP32 or block-quantized.

use burn_tensor::{backend::Backend, Int, Tensor};

use crate::quant::{QuantMatrix, QuantOps};

/// The weight of a [`Linear`] layer.
#[derive(Debug, Clone)]
pub enum Weight<B: Backend> {
    /// FP32, stored `[in, out]` for `x @ w`.
    Dense(Tensor<B, 2>),
    /// Block-quantized, stored `[out, in]` as GGUF stores it.
    Quant(QuantMatrix<B>),
}

/// `y = x @ W`, no bias (Llama has none).
#[derive(Debug, Clone)]
pub struct Linear<B: Backend> {
    pub weight: Weight<B>,
}

impl<B: Backend> Linear<B> {
    /// Wraps an FP32 `[in, out]` weight.
    pub fn new(weight: Tensor<B, 2>) -> Self {
        Self {
            weight: Weight::Dense(weight),
        }
    }

    /// Wraps a quantized `[out, in]` weight.
    pub fn quantized(weight: QuantMatrix<B>) -> Self {
        Self {
            weight: Weight::Quant(weight),
        }
    }

    /// The device holding the weight.
    pub fn device(&self) -> B::Device {
        match &self.weight {
            Weight::Dense(w) => w.device(),
            Weight::Quant(q) => q.device(),
        }
    }

    /// Bytes the weight takes on the device.
    pub fn bytes(&self) -> usize {
        match &self.weight {
            Weight::Dense(w) => w.shape().num_elements() * w.dtype().size(),
            Weight::Quant(q) => q.bytes(),
        }
    }

    /// The quantized weight, if it is one.
    pub fn quant(&self) -> Option<&QuantMatrix<B>> {
        match &self.weight {
            Weight::Quant(q) => Some(q),
            Weight::Dense(_) => None,
        }
    }

    /// Whether the weight is kept quantized.
    pub fn is_quantized(&self) -> bool {
        matches!(self.weight, Weight::Quant(_))
    }
}

impl<B: QuantOps> Linear<B> {
    /// Applies the layer to `x` of shape `[tokens, in]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        match &self.weight {
            Weight::Dense(w) => B::dense_matmul(x, w),
            Weight::Quant(q) => B::quant_matmul(x, q),
        }
    }

    /// Several layers applied to the same `x`: one pass over the input where every
    /// weight is quantized, else one product each.
    pub fn forward_many(x: Tensor<B, 2>, layers: &[Self]) -> Vec<Tensor<B, 2>> {
        let quant: Option<Vec<&QuantMatrix<B>>> = layers.iter().map(Self::quant).collect();
        match quant {
            Some(ws) => B::quant_matmul_many(x, &ws),
            None => layers.iter().map(|l| l.forward(x.clone())).collect(),
        }
    }

    /// Columns `ids` of `W` as rows `[ids, in]`: the embedding lookup of a table that is
    /// also the tied output layer.
    pub fn columns(&self, ids: Tensor<B, 1, Int>) -> Tensor<B, 2> {
        match &self.weight {
            Weight::Dense(w) => w.clone().select(1, ids).transpose(),
            Weight::Quant(q) => B::quant_rows(ids, q),
        }
    }
}
