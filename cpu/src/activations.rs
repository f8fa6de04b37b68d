//! Activations quantized to 8 bits per block of 32, as the integer dot products read them.

use crate::format::QBLOCK;

/// `[tokens, cols]` FP32 activations as signed bytes with one scale per block:
/// `x ≈ d * q`, `d = max|x| / 127`. `s = d * sum(q)` per block serves the weights' offset
/// term (`m * sum(x)`).
#[derive(Debug, Clone, Default)]
pub struct Q8Activations {
    pub(crate) tokens: usize,
    pub(crate) cols: usize,
    pub(crate) q: Vec<i8>,
    pub(crate) d: Vec<f32>,
    pub(crate) s: Vec<f32>,
}

impl Q8Activations {
    /// Quantizes `x` (`tokens * cols` values, `cols` a multiple of 32).
    pub fn quantize(x: &[f32], tokens: usize, cols: usize) -> Self {
        assert_eq!(x.len(), tokens * cols, "activations are [tokens, cols]");
        assert!(cols.is_multiple_of(QBLOCK), "whole blocks");
        let blocks = tokens * cols / QBLOCK;
        let mut q = vec![0i8; tokens * cols];
        let mut d = vec![0.0f32; blocks];
        let mut s = vec![0.0f32; blocks];
        for (b, (xs, qs)) in x
            .chunks_exact(QBLOCK)
            .zip(q.chunks_exact_mut(QBLOCK))
            .enumerate()
        {
            let amax = xs.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let scale = amax / 127.0;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in qs.iter_mut().zip(xs) {
                let r = (v * inv).round() as i8;
                *q = r;
                sum += i32::from(r);
            }
            d[b] = scale;
            s[b] = scale * sum as f32;
        }
        Self {
            tokens,
            cols,
            q,
            d,
            s,
        }
    }

    /// Tokens (rows).
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// The values the kernels multiply: `d * q`, `[tokens, cols]`.
    pub fn dequantize(&self) -> Vec<f32> {
        self.q
            .chunks_exact(QBLOCK)
            .zip(&self.d)
            .flat_map(|(q, &d)| q.iter().map(move |&q| d * f32::from(q)))
            .collect()
    }

    /// Token `t`'s codes, block scales and block sums.
    pub(crate) fn token(&self, t: usize) -> (&[i8], &[f32], &[f32]) {
        let nb = self.cols / QBLOCK;
        (
            &self.q[t * self.cols..(t + 1) * self.cols],
            &self.d[t * nb..(t + 1) * nb],
            &self.s[t * nb..(t + 1) * nb],
        )
    }
}
