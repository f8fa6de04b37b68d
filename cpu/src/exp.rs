//! `e^x` eight lanes at a time, for the softmax and SwiGLU: libm's `expf` called per value
//! was most of both.

/// AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// `e^x` in every lane: `2^n e^r` with `n = round(x / ln 2)` and `e^r` by Cephes'
    /// polynomial on `|r| <= ln 2 / 2`, within 1 ulp of libm's `expf`. `x` is clamped to
    /// `[-87, 88]`: below, `e^x` is under `2^-125` and gives `e^-87`; above, `e^88`
    /// (finite) where `expf` overflows.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn exp8(x: __m256) -> __m256 {
        let x = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(-87.0)),
            _mm256_set1_ps(88.0),
        );
        let n = _mm256_round_ps(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        );
        // r = x - n ln 2, with ln 2 in two parts so that n ln 2's rounding does not show.
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let r2 = _mm256_mul_ps(r, r);
        let e = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
        let scale = _mm256_slli_epi32(
            _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
            23,
        );
        _mm256_mul_ps(e, _mm256_castsi256_ps(scale))
    }
}
