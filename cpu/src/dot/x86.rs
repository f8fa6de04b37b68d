//! x86-64 levels: AVX2 (`vpmaddubsw` + `vpmaddwd`) and AVX-512 VNNI (`vpdpbusd` on 256-bit
//! vectors). Both are stamped from one body; they differ in the block's integer sum.
//!
//! Q4 codes (0..15) are unsigned, so they multiply the signed activations directly; Q8_0
//! codes are signed, so the sum is taken as `|w| * (x with w's sign)`.

macro_rules! level {
    ($name:ident, $features:literal, |$w:ident, $x:ident| q4: $q4:expr, q8: $q8:expr) => {
        pub(super) mod $name {
            use std::arch::x86_64::*;

            use crate::activations::Q8Activations;
            use crate::format::{QuantFormat, QBLOCK};

            /// Tokens per register tile.
            const TILE: usize = 4;

            #[target_feature(enable = $features)]
            fn isum_q4($w: __m256i, $x: __m256i) -> __m256i {
                $q4
            }

            #[target_feature(enable = $features)]
            fn isum_q8($w: __m256i, $x: __m256i) -> __m256i {
                $q8
            }

            #[target_feature(enable = $features)]
            fn hsum(v: __m256) -> f32 {
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
                _mm_cvtss_f32(s)
            }

            /// One IEEE half to FP32 (F16C).
            #[target_feature(enable = $features)]
            fn half(h: u16) -> f32 {
                _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
            }

            /// The row's block scales `d` and offsets `m` in FP32 (see `dot`), eight
            /// halves per conversion.
            #[target_feature(enable = $features)]
            fn row_scales(format: QuantFormat, halves: &[u16], d: &mut [f32], m: &mut [f32]) {
                let nb = d.len();
                let hp = halves.as_ptr();
                let mut b = 0;
                match format {
                    QuantFormat::Q4_1 => {
                        // d0 m0 d1 m1 .. -> d0 d1 d2 d3 | m0 m1 m2 m3
                        let split = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
                        while b + 4 <= nb {
                            // SAFETY: the row holds 2 * nb halves; b + 4 <= nb.
                            unsafe {
                                let h = _mm_loadu_si128(hp.add(2 * b) as *const __m128i);
                                let v = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(h), split);
                                _mm_storeu_ps(d.as_mut_ptr().add(b), _mm256_castps256_ps128(v));
                                _mm_storeu_ps(m.as_mut_ptr().add(b), _mm256_extractf128_ps(v, 1));
                            }
                            b += 4;
                        }
                        for b in b..nb {
                            d[b] = half(halves[2 * b]);
                            m[b] = half(halves[2 * b + 1]);
                        }
                    }
                    QuantFormat::Q4_0 | QuantFormat::Q8_0 => {
                        while b + 8 <= nb {
                            // SAFETY: the row holds nb halves; b + 8 <= nb.
                            unsafe {
                                let h = _mm_loadu_si128(hp.add(b) as *const __m128i);
                                _mm256_storeu_ps(d.as_mut_ptr().add(b), _mm256_cvtph_ps(h));
                            }
                            b += 8;
                        }
                        for b in b..nb {
                            d[b] = half(halves[b]);
                        }
                        let offset = if format == QuantFormat::Q4_0 {
                            -8.0
                        } else {
                            0.0
                        };
                        for (m, d) in m.iter_mut().zip(d.iter()) {
                            *m = offset * d;
                        }
                    }
                }
            }

            /// `N` tokens of one row: `out[j] = row · x[j]`, with the row's scales in FP32.
            #[target_feature(enable = $features)]
            unsafe fn tile<const N: usize>(
                format: QuantFormat,
                codes: &[u8],
                d: &[f32],
                m: &[f32],
                x: [(&[i8], &[f32], &[f32]); N],
                out: &mut [f32],
            ) {
                let nb = d.len();
                let mut acc = [_mm256_setzero_ps(); N];
                let cp = codes.as_ptr();
                // SAFETY (every load below): the row holds `nb` blocks of codes and each
                // token `nb * 32` codes and `nb` scales, checked by the caller.
                match format {
                    QuantFormat::Q8_0 => {
                        for b in 0..nb {
                            let w = unsafe { _mm256_loadu_si256(cp.add(32 * b) as *const __m256i) };
                            let db = unsafe { *d.get_unchecked(b) };
                            for j in 0..N {
                                let xq = unsafe {
                                    _mm256_loadu_si256(
                                        x[j].0.as_ptr().add(QBLOCK * b) as *const __m256i
                                    )
                                };
                                let s = db * unsafe { *x[j].1.get_unchecked(b) };
                                let i = isum_q8(w, xq);
                                acc[j] = _mm256_fmadd_ps(
                                    _mm256_cvtepi32_ps(i),
                                    _mm256_set1_ps(s),
                                    acc[j],
                                );
                            }
                        }
                    }
                    QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
                        let mask = _mm_set1_epi8(15);
                        for b in 0..nb {
                            let raw = unsafe { _mm_loadu_si128(cp.add(16 * b) as *const __m128i) };
                            let lo = _mm_and_si128(raw, mask);
                            let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
                            let w = _mm256_set_m128i(hi, lo);
                            let db = unsafe { *d.get_unchecked(b) };
                            for j in 0..N {
                                let xq = unsafe {
                                    _mm256_loadu_si256(
                                        x[j].0.as_ptr().add(QBLOCK * b) as *const __m256i
                                    )
                                };
                                let s = db * unsafe { *x[j].1.get_unchecked(b) };
                                let i = isum_q4(w, xq);
                                acc[j] = _mm256_fmadd_ps(
                                    _mm256_cvtepi32_ps(i),
                                    _mm256_set1_ps(s),
                                    acc[j],
                                );
                            }
                        }
                    }
                }
                for j in 0..N {
                    // The offsets' term, `sum_b m_b s_b`, summed in the order `tile_direct`
                    // sums it, so a token's result does not depend on its batch.
                    let mut offsets = 0.0f32;
                    for (mb, xs) in m.iter().zip(x[j].2) {
                        offsets += mb * xs;
                    }
                    out[j] = hsum(acc[j]) + offsets;
                }
            }

            /// Block `b`'s `d` and `m` (see the module above `dot`).
            #[target_feature(enable = $features)]
            unsafe fn scales(format: QuantFormat, halves: *const u16, b: usize) -> (f32, f32) {
                // SAFETY: the caller passes a row holding block `b`'s halves.
                unsafe {
                    match format {
                        QuantFormat::Q4_1 => {
                            let dm = (halves.add(2 * b) as *const i32).read_unaligned();
                            let v = _mm_cvtph_ps(_mm_cvtsi32_si128(dm));
                            (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
                        }
                        QuantFormat::Q4_0 => {
                            let d = half(*halves.add(b));
                            (d, -8.0 * d)
                        }
                        QuantFormat::Q8_0 => (half(*halves.add(b)), 0.0),
                    }
                }
            }

            /// `N` tokens of one row: `out[j] = row · x[j]`, each block's scales converted where
            /// they are used (for one token, cheaper than converting the row first).
            #[target_feature(enable = $features)]
            unsafe fn tile_direct<const N: usize>(
                format: QuantFormat,
                codes: &[u8],
                halves: &[u16],
                nb: usize,
                x: [(&[i8], &[f32], &[f32]); N],
                out: &mut [f32],
            ) {
                let mut acc = [_mm256_setzero_ps(); N];
                let mut macc = [0.0f32; N];
                let cp = codes.as_ptr();
                let hp = halves.as_ptr();
                // SAFETY (every load below): the row holds `nb` blocks of codes and scales
                // and each token `nb * 32` codes and `nb` scales, checked by the caller.
                match format {
                    QuantFormat::Q8_0 => {
                        for b in 0..nb {
                            let w = unsafe { _mm256_loadu_si256(cp.add(32 * b) as *const __m256i) };
                            let (d, _) = unsafe { scales(format, hp, b) };
                            for j in 0..N {
                                let xq = unsafe {
                                    _mm256_loadu_si256(
                                        x[j].0.as_ptr().add(QBLOCK * b) as *const __m256i
                                    )
                                };
                                let s = d * unsafe { *x[j].1.get_unchecked(b) };
                                let i = isum_q8(w, xq);
                                acc[j] = _mm256_fmadd_ps(
                                    _mm256_cvtepi32_ps(i),
                                    _mm256_set1_ps(s),
                                    acc[j],
                                );
                            }
                        }
                    }
                    QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
                        let mask = _mm_set1_epi8(15);
                        for b in 0..nb {
                            let raw = unsafe { _mm_loadu_si128(cp.add(16 * b) as *const __m128i) };
                            let lo = _mm_and_si128(raw, mask);
                            let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
                            let w = _mm256_set_m128i(hi, lo);
                            let (d, m) = unsafe { scales(format, hp, b) };
                            for j in 0..N {
                                let xq = unsafe {
                                    _mm256_loadu_si256(
                                        x[j].0.as_ptr().add(QBLOCK * b) as *const __m256i
                                    )
                                };
                                let (xd, xs) =
                                    unsafe { (*x[j].1.get_unchecked(b), *x[j].2.get_unchecked(b)) };
                                let i = isum_q4(w, xq);
                                acc[j] = _mm256_fmadd_ps(
                                    _mm256_cvtepi32_ps(i),
                                    _mm256_set1_ps(d * xd),
                                    acc[j],
                                );
                                macc[j] += m * xs;
                            }
                        }
                    }
                }
                for j in 0..N {
                    out[j] = hsum(acc[j]) + macc[j];
                }
            }

            /// Every token of `acts` against one row, in tiles of [`TILE`] tokens.
            ///
            /// # Safety
            /// The CPU has the level's features.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn row(
                format: QuantFormat,
                codes: &[u8],
                halves: &[u16],
                acts: &Q8Activations,
                out: &mut [f32],
                scratch: &mut Vec<f32>,
            ) {
                let nb = acts.cols / QBLOCK;
                assert!(codes.len() >= nb * format.code_bytes());
                assert!(halves.len() >= nb * format.scale_halves());
                assert!(out.len() >= acts.tokens);
                if acts.tokens == 1 {
                    // SAFETY: sizes checked above.
                    unsafe { tile_direct::<1>(format, codes, halves, nb, [acts.token(0)], out) };
                    return;
                }
                // The row's scales in FP32.
                scratch.resize(2 * nb, 0.0);
                let (d, m) = scratch.split_at_mut(nb);
                row_scales(format, halves, d, m);
                let (d, m) = (&*d, &*m);
                let mut t = 0;
                while t < acts.tokens {
                    let n = (acts.tokens - t).min(TILE);
                    let o = &mut out[t..t + n];
                    // SAFETY: sizes checked above.
                    unsafe {
                        match n {
                            4 => tile::<4>(
                                format,
                                codes,
                                d,
                                m,
                                std::array::from_fn(|j| acts.token(t + j)),
                                o,
                            ),
                            3 => tile::<3>(
                                format,
                                codes,
                                d,
                                m,
                                std::array::from_fn(|j| acts.token(t + j)),
                                o,
                            ),
                            2 => tile::<2>(
                                format,
                                codes,
                                d,
                                m,
                                std::array::from_fn(|j| acts.token(t + j)),
                                o,
                            ),
                            _ => tile::<1>(format, codes, d, m, [acts.token(t)], o),
                        }
                    }
                    t += n;
                }
            }
        }
    };
}

level!(avx2, "avx2,fma,f16c", |w, x|
    q4: _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)),
    q8: _mm256_madd_epi16(
        _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)),
        _mm256_set1_epi16(1)
    )
);

level!(vnni, "avx2,fma,f16c,avx512vnni,avx512vl", |w, x|
    q4: _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x),
    q8: _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
);
