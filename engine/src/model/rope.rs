//! Rotary position embedding. Llama's GGUF layout rotates adjacent dimensions (2i, 2i+1)
//! (llama.cpp's converter permutes its Q and K weights for it); the NeoX layout (Gemma,
//! Qwen) rotates dimension i with i + head_dim / 2. Either way angle i is
//! `position * theta^(-2i / head_dim) / factor_i`, the factors 1 unless the file gives
//! them (Llama 3's `rope_freqs`).

use std::sync::Arc;

use burn_tensor::{backend::Backend, Int, Tensor, TensorData};

use super::RopeStyle;

/// Precomputed cos/sin tables for every position of the context, on the device and (for
/// the CPU backend's in-place RoPE) on the host.
#[derive(Debug, Clone)]
pub struct Rope<B: Backend> {
    style: RopeStyle,
    /// `[max_len, head_dim]`: cos and sin of each angle side by side, as the fused
    /// kernels read them (one binding) whichever way the style pairs dimensions.
    pairs: Tensor<B, 2>,
    host: Arc<(Vec<f32>, Vec<f32>)>,
}

impl<B: Backend> Rope<B> {
    /// Tables for `max_len` positions of heads of size `head_dim` with frequency base
    /// `theta`, each frequency divided by its entry of `factors` where given, rotating as
    /// `style` pairs dimensions.
    pub fn new(
        head_dim: usize,
        max_len: usize,
        theta: f64,
        factors: Option<&[f32]>,
        style: RopeStyle,
        device: &B::Device,
    ) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(max_len * half);
        let mut sin = Vec::with_capacity(max_len * half);
        let freqs: Vec<f64> = (0..half)
            .map(|i| {
                let factor = factors.map_or(1.0, |f| f64::from(f[i]));
                theta.powf(-2.0 * i as f64 / head_dim as f64) / factor
            })
            .collect();
        for pos in 0..max_len {
            for &freq in &freqs {
                let angle = pos as f64 * freq;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        let pairs: Vec<f32> = cos.iter().zip(&sin).flat_map(|(&c, &s)| [c, s]).collect();
        Self {
            style,
            pairs: Tensor::from_data(
                TensorData::new(pairs, [max_len, 2 * half]),
                (device, burn_tensor::DType::F32),
            ),
            host: Arc::new((cos, sin)),
        }
    }

    /// How dimensions are paired.
    pub fn style(&self) -> RopeStyle {
        self.style
    }

    /// The cos and sin tables on the host, `head_dim / 2` angles per position.
    pub fn host_tables(&self) -> (&[f32], &[f32]) {
        (&self.host.0, &self.host.1)
    }

    /// `[max_len, head_dim]`: cos and sin of angle `i` at columns `2 i` and `2 i + 1`
    /// (FP32).
    pub fn pairs(&self) -> &Tensor<B, 2> {
        &self.pairs
    }

    /// Rotates `x` of shape `[rows, heads * head_dim]` whose row `r` is at `positions[r]`.
    pub fn apply_rows(
        &self,
        x: Tensor<B, 2>,
        heads: usize,
        positions: Tensor<B, 1, Int>,
    ) -> Tensor<B, 2> {
        let [rows, width] = x.dims();
        let half = width / heads / 2;
        let angles = self
            .pairs
            .clone()
            .select(0, positions)
            .cast(x.dtype())
            .reshape([rows, half, 2]);
        let table =
            |column: usize, shape: [usize; 4]| angles.clone().narrow(2, column, 1).reshape(shape);
        match self.style {
            RopeStyle::Adjacent => {
                let shape = [rows, 1, half, 1];
                rotate(
                    x.reshape([rows, heads, half, 2]),
                    table(0, shape),
                    table(1, shape),
                    3,
                )
            }
            RopeStyle::Neox => {
                let shape = [rows, 1, 1, half];
                rotate(
                    x.reshape([rows, heads, 2, half]),
                    table(0, shape),
                    table(1, shape),
                    2,
                )
            }
        }
        .reshape([rows, width])
    }
}

/// Rotates the pairs that axis `axis` (of size 2) holds by the angles whose cos/sin
/// broadcast against them.
fn rotate<B: Backend>(
    pairs: Tensor<B, 4>,
    cos: Tensor<B, 4>,
    sin: Tensor<B, 4>,
    axis: usize,
) -> Tensor<B, 4> {
    let a = pairs.clone().narrow(axis, 0, 1);
    let b = pairs.narrow(axis, 1, 1);
    let ra = a.clone().mul(cos.clone()).sub(b.clone().mul(sin.clone()));
    let rb = a.mul(sin).add(b.mul(cos));
    Tensor::cat(vec![ra, rb], axis)
}
