//! A bias-free linear layer whose weight is FP32 or block-quantized, in one piece or (where
//! it is larger than the device holds in one buffer) in bands of output rows.

use burn_tensor::{backend::Backend, DType, Int, Tensor, TensorData};

use crate::quant::{QuantMatrix, QuantOps};

/// The weight of a [`Linear`] layer.
#[derive(Debug, Clone)]
pub enum Weight<B: Backend> {
    /// FP32, stored `[in, out]` for `x @ w`.
    Dense(Tensor<B, 2>),
    /// Block-quantized, stored `[out, in]` as GGUF stores it.
    Quant(QuantMatrix<B>),
    /// Consecutive bands of output rows, one layer each: a weight larger than the
    /// device's largest buffer (Gemma's 262,144-row output layer on wgpu).
    Bands(Vec<Linear<B>>),
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

    /// The layer whose output rows are those of `bands`, in order.
    pub fn bands(bands: Vec<Self>) -> Self {
        Self {
            weight: Weight::Bands(bands),
        }
    }

    /// The device holding the weight.
    pub fn device(&self) -> B::Device {
        match &self.weight {
            Weight::Dense(w) => w.device(),
            Weight::Quant(q) => q.device(),
            Weight::Bands(b) => b[0].device(),
        }
    }

    /// Bytes the weight takes on the device.
    pub fn bytes(&self) -> usize {
        match &self.weight {
            Weight::Dense(w) => w.shape().num_elements() * w.dtype().size(),
            Weight::Quant(q) => q.bytes(),
            Weight::Bands(b) => b.iter().map(Self::bytes).sum(),
        }
    }

    /// Output rows.
    pub fn outputs(&self) -> usize {
        match &self.weight {
            Weight::Dense(w) => w.dims()[1],
            Weight::Quant(q) => q.rows,
            Weight::Bands(b) => b.iter().map(Self::outputs).sum(),
        }
    }

    /// The quantized weight, if it is one in one piece.
    pub fn quant(&self) -> Option<&QuantMatrix<B>> {
        match &self.weight {
            Weight::Quant(q) => Some(q),
            Weight::Dense(_) | Weight::Bands(_) => None,
        }
    }

    /// Whether the weight is kept quantized.
    pub fn is_quantized(&self) -> bool {
        match &self.weight {
            Weight::Quant(_) => true,
            Weight::Dense(_) => false,
            Weight::Bands(b) => b.iter().all(Self::is_quantized),
        }
    }
}

impl<B: QuantOps> Linear<B> {
    /// Applies the layer to `x` of shape `[tokens, in]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        match &self.weight {
            Weight::Dense(w) => B::dense_matmul(x, w),
            Weight::Quant(q) => B::quant_matmul(x, q),
            Weight::Bands(b) => Tensor::cat(b.iter().map(|l| l.forward(x.clone())).collect(), 1),
        }
    }

    /// [`Self::forward`] in FP32 whatever `x`'s float type: the output layer's logits. Our
    /// quantized kernels write their products in FP32 already; a dense weight's product
    /// is converted.
    pub fn forward_f32(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.forward(x).cast(DType::F32)
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
    pub fn columns(&self, ids: &[u32]) -> Tensor<B, 2> {
        let device = self.device();
        let upload = |ids: Vec<i64>| {
            let n = ids.len();
            Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [n]), &device)
        };
        match &self.weight {
            Weight::Dense(w) => {
                let ids = upload(ids.iter().map(|&i| i64::from(i)).collect());
                w.clone().select(1, ids).transpose()
            }
            Weight::Quant(q) => {
                B::quant_rows(upload(ids.iter().map(|&i| i64::from(i)).collect()), q)
            }
            Weight::Bands(bands) => {
                // Each band's rows, then back in the order asked.
                let (mut parts, mut order) = (Vec::new(), Vec::new());
                let mut first = 0u32;
                for band in bands {
                    let end = first + band.outputs() as u32;
                    let (at, local): (Vec<i64>, Vec<u32>) = ids
                        .iter()
                        .enumerate()
                        .filter(|(_, &id)| (first..end).contains(&id))
                        .map(|(i, &id)| (i as i64, id - first))
                        .unzip();
                    if !local.is_empty() {
                        parts.push(band.columns(&local));
                        order.extend(at);
                    }
                    first = end;
                }
                let mut inverse = vec![0i64; order.len()];
                for (row, &i) in order.iter().enumerate() {
                    inverse[i as usize] = row as i64;
                }
                Tensor::cat(parts, 0).select(0, upload(inverse))
            }
        }
    }
}
