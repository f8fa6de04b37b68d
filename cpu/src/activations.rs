//! Activations quantized to 8 bits per block of 32, as the integer dot products read them.

use crate::format::QBLOCK;

/// `[tokens, cols]` FP32 activations as signed bytes with one scale per block:
/// `x ≈ d * q`, `d = max|x| / 127`. `s = d * sum(q)` per block serves the weights' offset
/// term (`m * sum(x)`).
#[derive(Debug, Clone, Default, PartialEq)]
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
        let mut out = Self::sized(x, tokens, cols);
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            unsafe { quantize_avx2(x, &mut out) };
            return out;
        }
        quantize_blocks(x, &mut out);
        out
    }

    /// [`Self::quantize`] in plain Rust on any CPU: the results the SIMD path must match.
    pub fn quantize_portable(x: &[f32], tokens: usize, cols: usize) -> Self {
        let mut out = Self::sized(x, tokens, cols);
        quantize_blocks(x, &mut out);
        out
    }

    /// Zeroed storage for `x` as `[tokens, cols]`.
    fn sized(x: &[f32], tokens: usize, cols: usize) -> Self {
        assert_eq!(x.len(), tokens * cols, "activations are [tokens, cols]");
        assert!(cols.is_multiple_of(QBLOCK), "whole blocks");
        let blocks = tokens * cols / QBLOCK;
        Self {
            tokens,
            cols,
            q: vec![0i8; tokens * cols],
            d: vec![0.0f32; blocks],
            s: vec![0.0f32; blocks],
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

/// [`quantize_blocks`] in AVX2 intrinsics, with the same results: the maximum is exact in
/// any order, `v * inv` is the same single multiply, and `cvtps2dq` rounds to nearest
/// even under the default MXCSR, as `round_ties_even` does (activations are finite).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_avx2(x: &[f32], out: &mut Q8Activations) {
    use std::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    // `packs` interleaves its inputs per 128-bit lane; this puts the bytes back in order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (b, (xs, qs)) in x
        .chunks_exact(QBLOCK)
        .zip(out.q.chunks_exact_mut(QBLOCK))
        .enumerate()
    {
        // SAFETY: a block is 32 values (four vectors) and 32 codes (one vector).
        let v: [__m256; 4] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(xs.as_ptr().add(8 * i)) });
        let mut m = _mm256_andnot_ps(sign, v[0]);
        for &vi in &v[1..] {
            m = _mm256_max_ps(_mm256_andnot_ps(sign, vi), m);
        }
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
        let scale = amax / 127.0;
        let inv = _mm256_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
        let q: [__m256i; 4] = std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv)));
        let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)));
        let bytes = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let bytes = _mm256_permutevar8x32_epi32(bytes, order);
        // SAFETY: as above.
        unsafe { _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, bytes) };
        out.d[b] = scale;
        out.s[b] = scale * sum as f32;
    }
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
