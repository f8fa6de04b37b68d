//! Activations quantized to 8 bits per block of 32, as the integer dot products read them.

use crate::format::QBLOCK;

/// `[tokens, cols]` FP32 activations as signed bytes with one scale per block:
/// `x ≈ d * q`, `d = max|x| / 127`. `s = d * sum(q)` per block serves the weights' offset
/// term (`m * sum(x)`), and `h`, the same for each half of 16 values (two per block),
/// the offsets per half of K2, K3 and K6.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Q8Activations {
    pub(crate) tokens: usize,
    pub(crate) cols: usize,
    pub(crate) q: Vec<i8>,
    pub(crate) d: Vec<f32>,
    pub(crate) s: Vec<f32>,
    pub(crate) h: Vec<f32>,
}

/// One token's quantized activations as a kernel reads them: codes, then per block the
/// scale and sum, and per half block the sum.
pub(crate) type TokenActs<'a> = (&'a [i8], &'a [f32], &'a [f32], &'a [f32]);

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
            h: vec![0.0f32; 2 * blocks],
        }
    }

    /// Block `b`'s scale, and its sums from the integer sums of its halves.
    #[inline(always)]
    fn set_sums(&mut self, b: usize, scale: f32, halves: [i32; 2]) {
        self.d[b] = scale;
        self.s[b] = scale * (halves[0] + halves[1]) as f32;
        self.h[2 * b] = scale * halves[0] as f32;
        self.h[2 * b + 1] = scale * halves[1] as f32;
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

    /// Tokens `t0..t0 + N` as [`Self::token`] gives them, for a kernel's token tile
    /// (inlined, with no closure: called for every group and tile, it took 2% of a
    /// prefill when it was a call).
    #[inline(always)]
    #[cfg(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        all(target_arch = "wasm32", target_feature = "simd128")
    ))]
    pub(crate) fn tile<const N: usize>(&self, t0: usize) -> [TokenActs<'_>; N] {
        let mut tile = [self.token(t0); N];
        for (j, t) in tile.iter_mut().enumerate().skip(1) {
            *t = self.token(t0 + j);
        }
        tile
    }

    /// Token `t`'s codes, block scales, block sums and half-block sums.
    #[inline(always)]
    pub(crate) fn token(&self, t: usize) -> TokenActs<'_> {
        let nb = self.cols / QBLOCK;
        (
            &self.q[t * self.cols..(t + 1) * self.cols],
            &self.d[t * nb..(t + 1) * nb],
            &self.s[t * nb..(t + 1) * nb],
            &self.h[2 * t * nb..2 * (t + 1) * nb],
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
    let mut codes = std::mem::take(&mut out.q);
    for (b, (xs, qs)) in x
        .chunks_exact(QBLOCK)
        .zip(codes.chunks_exact_mut(QBLOCK))
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
        let half_sum = |a: __m256i, b: __m256i| {
            let s = _mm256_add_epi32(a, b);
            let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
            _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)))
        };
        let halves = [half_sum(q[0], q[1]), half_sum(q[2], q[3])];
        let bytes = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let bytes = _mm256_permutevar8x32_epi32(bytes, order);
        // SAFETY: as above.
        unsafe { _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, bytes) };
        out.set_sums(b, scale, halves);
    }
    out.q = codes;
}

/// Fills `out` (sized for `x`) block by block.
#[inline(always)]
fn quantize_blocks(x: &[f32], out: &mut Q8Activations) {
    const LANES: usize = 8;
    let mut codes = std::mem::take(&mut out.q);
    for (b, (xs, qs)) in x
        .chunks_exact(QBLOCK)
        .zip(codes.chunks_exact_mut(QBLOCK))
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
        let mut halves = [0i32; 2];
        for (j, (q, &v)) in qs.iter_mut().zip(xs).enumerate() {
            let r = (v * inv).round_ties_even() as i32;
            *q = r as i8;
            halves[j / 16] += r;
        }
        out.set_sums(b, scale, halves);
    }
    out.q = codes;
}
