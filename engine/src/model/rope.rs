//! Rotary position embedding in GGUF's layout: rotated pairs are adjacent dimensions
//! (2i, 2i+1), because llama.cpp's converter permutes the Q and K weights for it.

use std::sync::Arc;

use burn_tensor::{backend::Backend, Int, Tensor, TensorData};

/// Precomputed cos/sin tables for every position of the context, on the device and (for
/// the CPU backend's in-place RoPE) on the host.
#[derive(Debug, Clone)]
pub struct Rope<B: Backend> {
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    /// `[max_len, head_dim]`: cos and sin of each angle side by side, as the fused
    /// kernels read them (one binding).
    pairs: Tensor<B, 2>,
    host: Arc<(Vec<f32>, Vec<f32>)>,
}

impl<B: Backend> Rope<B> {
    /// Tables for `max_len` positions of heads of size `head_dim` with frequency base `theta`.
    pub fn new(head_dim: usize, max_len: usize, theta: f64, device: &B::Device) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(max_len * half);
        let mut sin = Vec::with_capacity(max_len * half);
        for pos in 0..max_len {
            for i in 0..half {
                let freq = theta.powf(-2.0 * i as f64 / head_dim as f64);
                let angle = pos as f64 * freq;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        let table =
            |v: &Vec<f32>| Tensor::from_data(TensorData::new(v.clone(), [max_len, half]), device);
        let pairs: Vec<f32> = cos.iter().zip(&sin).flat_map(|(&c, &s)| [c, s]).collect();
        Self {
            cos: table(&cos),
            sin: table(&sin),
            pairs: Tensor::from_data(TensorData::new(pairs, [max_len, 2 * half]), device),
            host: Arc::new((cos, sin)),
        }
    }

    /// The cos and sin tables on the host, `head_dim / 2` angles per position.
    pub fn host_tables(&self) -> (&[f32], &[f32]) {
        (&self.host.0, &self.host.1)
    }

    /// `[max_len, head_dim]`: cos and sin of angle `i` at columns `2 i` and `2 i + 1`.
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
        let table = |t: &Tensor<B, 2>| {
            t.clone()
                .select(0, positions.clone())
                .reshape([rows, 1, half, 1])
        };
        rotate(
            x.reshape([rows, heads, half, 2]),
            table(&self.cos),
            table(&self.sin),
        )
        .reshape([rows, width])
    }
}

/// Rotates adjacent pairs (last axis) by the angles whose cos/sin broadcast against them.
fn rotate<B: Backend>(pairs: Tensor<B, 4>, cos: Tensor<B, 4>, sin: Tensor<B, 4>) -> Tensor<B, 4> {
    let a = pairs.clone().narrow(3, 0, 1);
    let b = pairs.narrow(3, 1, 1);
    let ra = a.clone().mul(cos.clone()).sub(b.clone().mul(sin.clone()));
    let rb = a.mul(sin).add(b.mul(cos));
    Tensor::cat(vec![ra, rb], 3)
}
