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
    /// Quantizes `x` (`tokens * cols` values, `cols` a multiple of 32). Codes are rounded
    /// to nearest, ties to even (as llama.cpp's x86 code rounds).
    pub fn quantize(x: &[f32], tokens: usize, cols: usize) -> Self {
        assert_eq!(x.len(), tokens * cols, "activations are [tokens, cols]");
        assert!(cols.is_multiple_of(QBLOCK), "whole blocks");
        let blocks = tokens * cols / QBLOCK;
        let mut out = Self {
            tokens,
            cols,
            q: vec![0i8; tokens * cols],
            d: vec![0.0f32; blocks],
            s: vec![0.0f32; blocks],
        };
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            unsafe { quantize_avx2(x, &mut out) };
            return out;
        }
        quantize_blocks(x, &mut out);
        out
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

/// [`quantize_blocks`] compiled for AVX2 (the same operations, exact in any order).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_avx2(x: &[f32], out: &mut Q8Activations) {
    quantize_blocks(x, out)
}

/// Fills `out` (sized for `x`) block by block.
#[inline(always)]
fn quantize_blocks(x: &[f32], out: &mut Q8Activations) {
    const LANES: usize = 8;
    for (b, (xs, qs)) in x
        .chunks_exact(QBLOCK)
        .zip(out.q.chunks_exact_mut(QBLOCK))
        .enumerate()
    {
        let mut lanes = [0.0f32; LANES];
        for c in xs.chunks_exact(LANES) {
            for (m, v) in lanes.iter_mut().zip(c) {
                *m = m.max(v.abs());
            }
        }
        let amax = lanes.iter().fold(0.0f32, |a, &m| a.max(m));
        let scale = amax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in qs.iter_mut().zip(xs) {
            let r = (v * inv).round_ties_even() as i32;
            *q = r as i8;
            sum += r;
        }
        out.d[b] = scale;
        out.s[b] = scale * sum as f32;
    }
}
