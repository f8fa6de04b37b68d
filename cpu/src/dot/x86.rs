//! x86-64 levels: AVX2 (`vpmaddubsw`) and AVX-512 VNNI (`vpdpbusd` on 256-bit vectors),
//! stamped from one body; they differ only in how a block's integer sum is accumulated,
//! and integer sums are exact, so both give identical results.
//!
//! A group-block's eight rows sit in the lanes (see `crate::interleaved`): a 32-byte chunk
//! of codes holds four bytes of each row, multiplied by the token's four matching
//! activation bytes broadcast to every lane. Q4 and K4 codes (0..15), and K2's and K3's
//! (0..3, 0..7, shifted out of their crumbs) are unsigned and
//! multiply the signed activations directly; Q5_0's, Q5_1's and K5's (0..31, the high bits
//! spread into bytes) and K6's (0..63, its high bits shifted into place) too, summed in 32
//! bits; Q8_0 and K8 codes are signed, so the product is taken as `|w| * (x with w's
//! sign)`.

macro_rules! level {
    (
        $name:ident, $features:literal,
        q4: |$a:ident, $w:ident, $x:ident| $q4:expr,
        q4_sum: |$s:ident| $q4_sum:expr,
        q8: |$a8:ident, $w8:ident, $x8:ident| $q8:expr
    ) => {
        pub(super) mod $name {
            use std::arch::x86_64::*;

            use crate::format::{QuantFormat, QBLOCK, SUPER_GROUPS};
            use crate::interleaved::{super_entry, LANES};

            /// Accumulates one chunk of Q4 codes times activations into `a`.
            #[target_feature(enable = $features)]
            fn q4_step($a: __m256i, $w: __m256i, $x: __m256i) -> __m256i {
                $q4
            }

            /// The block's integer sums (eight `i32`) from the Q4 accumulator.
            #[target_feature(enable = $features)]
            fn q4_sum($s: __m256i) -> __m256i {
                $q4_sum
            }

            /// Accumulates one chunk of `|w|` times signed activations into `a` (`i32`).
            #[target_feature(enable = $features)]
            fn q8_step($a8: __m256i, $w8: __m256i, $x8: __m256i) -> __m256i {
                $q8
            }

            /// Bits `k..k + 4` of each lane's word in `qh`, as bytes of 16 or 0 (byte `i`
            /// from bit `k + i`): the fifth bit of four Q5_0 codes.
            #[target_feature(enable = $features)]
            fn high_bits_at(qh: __m256i, k: i32) -> __m256i {
                let t = _mm256_srl_epi32(qh, _mm_cvtsi32_si128(k));
                let low_byte = _mm256_setr_epi8(
                    0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0, 4, 4, 4, 4, 8,
                    8, 8, 8, 12, 12, 12, 12,
                );
                let bits = _mm256_set1_epi32(0x0804_0201);
                let set = _mm256_cmpeq_epi8(
                    _mm256_and_si256(_mm256_shuffle_epi8(t, low_byte), bits),
                    bits,
                );
                _mm256_and_si256(set, _mm256_set1_epi8(16))
            }

            /// Scale steps `s` of a K format's group-block's eight rows, in FP32.
            ///
            /// # Safety
            /// `block` starts a group-block of a K format with at least `s + 1` steps.
            #[target_feature(enable = $features)]
            unsafe fn steps(block: *const u8, s: usize) -> __m256 {
                // SAFETY: eight signed bytes per step lead the group-block.
                let bytes = unsafe { _mm_loadl_epi64(block.add(LANES * s) as *const __m128i) };
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes))
            }

            /// A super entry's eight `d` and eight `-dmin`, in FP32.
            ///
            /// # Safety
            /// `sup` starts a super entry.
            #[target_feature(enable = $features)]
            unsafe fn super_halves(sup: *const u8) -> [__m256; 2] {
                // SAFETY: two runs of eight halves.
                unsafe {
                    [
                        _mm256_cvtph_ps(_mm_loadu_si128(sup as *const __m128i)),
                        _mm256_cvtph_ps(_mm_loadu_si128(sup.add(16) as *const __m128i)),
                    ]
                }
            }

            /// A group-block's two scale vectors, `d` and `m` (see `crate::dot`; K8, K2:
            /// the second half's `d`); `sup` its super-block's `d` and `-dmin` (the K
            /// formats).
            ///
            /// # Safety
            /// `block` starts a group-block of `format`.
            #[target_feature(enable = $features)]
            unsafe fn block_scales(
                format: QuantFormat,
                block: *const u8,
                sup: [__m256; 2],
            ) -> (__m256, __m256) {
                // SAFETY: the scales lead the group-block.
                unsafe {
                    if format.super_scales() {
                        let second = match format.half_scales() {
                            true => sup[0],
                            false => sup[1],
                        };
                        return (
                            _mm256_mul_ps(sup[0], steps(block, 0)),
                            _mm256_mul_ps(second, steps(block, 1)),
                        );
                    }
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(block as *const __m128i));
                    let m = match format {
                        QuantFormat::Q4_1 | QuantFormat::Q5_1 => {
                            _mm256_cvtph_ps(_mm_loadu_si128(block.add(2 * LANES) as *const __m128i))
                        }
                        f => _mm256_mul_ps(d, _mm256_set1_ps(f.offset(1.0))),
                    };
                    (d, m)
                }
            }

            /// The mins of the first and the second half: K2's steps 2 and 3 times
            /// `-dmin`, K6's `-32 d_h` and K3's `-4 d_h` from their halves' scales `(d,
            /// m)`; zeros for the other formats.
            ///
            /// # Safety
            /// `block` starts a group-block of `format`.
            #[target_feature(enable = $features)]
            unsafe fn half_mins(
                format: QuantFormat,
                block: *const u8,
                sup: [__m256; 2],
                (d, m): (__m256, __m256),
            ) -> (__m256, __m256) {
                let by = |v: __m256, s: f32| _mm256_mul_ps(v, _mm256_set1_ps(s));
                match format {
                    // SAFETY: four runs of steps lead the group-block.
                    QuantFormat::K2 => unsafe {
                        (
                            _mm256_mul_ps(sup[1], steps(block, 2)),
                            _mm256_mul_ps(sup[1], steps(block, 3)),
                        )
                    },
                    QuantFormat::K6 => (by(d, -32.0), by(m, -32.0)),
                    QuantFormat::K3 => (by(d, -4.0), by(m, -4.0)),
                    _ => (_mm256_setzero_ps(), _mm256_setzero_ps()),
                }
            }

            /// Four activation bytes in every lane.
            #[target_feature(enable = $features)]
            unsafe fn broadcast(x: *const i8) -> __m256i {
                // SAFETY: the caller passes four readable bytes.
                _mm256_set1_epi32(unsafe { (x as *const i32).read_unaligned() })
            }

            /// `N` tokens against one group of eight rows: `out[j][l] = row l · x[j]`.
            ///
            /// # Safety
            /// The CPU has the level's features; `group` holds `nb` group-blocks of
            /// `QuantFormat::ALL[F]` and each token `nb` blocks.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn tile<const N: usize, const F: usize>(
                group: &[u8],
                nb: usize,
                x: [crate::activations::TokenActs<'_>; N],
                out: &mut [[f32; LANES]],
                scales: Option<&[[f32; LANES]]>,
            ) {
                let format = QuantFormat::ALL[F];
                let k = format.expanded_vectors();
                // Only the K formats have expanded scales: the others' tiles fold the
                // branch away.
                let scales = scales.filter(|_| format.super_scales());
                let (gbb, codes_at) = (format.group_block_bytes(), format.group_codes_at());
                debug_assert!(group.len() >= format.group_bytes(nb) && out.len() >= N);
                let mut acc = [_mm256_setzero_ps(); N];
                let mut sup = [_mm256_setzero_ps(); 2];
                let mask = _mm256_set1_epi8(15);
                // SAFETY (every load below): within the group's `nb` group-blocks and
                // each token's `nb` blocks, as the caller guarantees.
                for b in 0..nb {
                    let block = unsafe { group.as_ptr().add(b * gbb) };
                    let codes = unsafe { block.add(codes_at) };
                    let ((d, m), (m0, m1)) = match scales {
                        // SAFETY: `k` vectors a block (checked by `group_dots`).
                        Some(s) => unsafe {
                            let v = s.as_ptr().add(k * b) as *const f32;
                            let mins = match format.half_mins() {
                                true => (
                                    _mm256_loadu_ps(v.add(2 * LANES)),
                                    _mm256_loadu_ps(v.add(3 * LANES)),
                                ),
                                false => (_mm256_setzero_ps(), _mm256_setzero_ps()),
                            };
                            ((_mm256_loadu_ps(v), _mm256_loadu_ps(v.add(LANES))), mins)
                        },
                        None => unsafe {
                            // The K formats' super-block scales, once per super-block.
                            if format.super_scales() && b % SUPER_GROUPS == 0 {
                                sup = super_halves(super_entry(format, group, nb, b).as_ptr());
                            }
                            let scales = block_scales(format, block, sup);
                            (scales, half_mins(format, block, sup, scales))
                        },
                    };
                    let xb: [*const i8; N] =
                        std::array::from_fn(|j| unsafe { x[j].0.as_ptr().add(QBLOCK * b) });
                    // K8 sums its two halves apart (one scale each): `second` holds chunks
                    // 4..8 there.
                    let mut isum = [_mm256_setzero_si256(); N];
                    let mut second = [_mm256_setzero_si256(); N];
                    if format.signed_codes() {
                        let split = if format == QuantFormat::K8 { 4 } else { 8 };
                        for c in 0..8 {
                            let w =
                                unsafe { _mm256_loadu_si256(codes.add(32 * c) as *const __m256i) };
                            let aw = _mm256_sign_epi8(w, w);
                            let sums = if c < split { &mut isum } else { &mut second };
                            for j in 0..N {
                                let xv = unsafe { broadcast(xb[j].add(4 * c)) };
                                sums[j] = q8_step(sums[j], aw, _mm256_sign_epi8(xv, w));
                            }
                        }
                    } else if format.crumbs() {
                        // Codes of 0..3 (K3: 0..7), the halves summed apart: a shift
                        // brings each chunk's crumbs (and K3's third bits) down (see
                        // `QuantFormat::K2`, `QuantFormat::K3`).
                        let (lv, hv) = unsafe {
                            (
                                _mm256_loadu_si256(codes as *const __m256i),
                                _mm256_loadu_si256(codes.add(32) as *const __m256i),
                            )
                        };
                        let third = match format == QuantFormat::K3 {
                            true => unsafe {
                                _mm256_loadu_si256(
                                    block.add(format.group_high_at()) as *const __m256i
                                )
                            },
                            false => _mm256_setzero_si256(),
                        };
                        let (three, one) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1));
                        for c in 0..4 {
                            let by = |v: __m256i, n: i32| _mm256_srl_epi16(v, _mm_cvtsi32_si128(n));
                            let mut lo = _mm256_and_si256(by(lv, 2 * c), three);
                            let mut hi = _mm256_and_si256(by(hv, 2 * c), three);
                            if format == QuantFormat::K3 {
                                let bit = |n: i32| {
                                    _mm256_slli_epi16(_mm256_and_si256(by(third, n), one), 2)
                                };
                                lo = _mm256_or_si256(lo, bit(c));
                                hi = _mm256_or_si256(hi, bit(4 + c));
                            }
                            let c = c as usize;
                            for j in 0..N {
                                let xl = unsafe { broadcast(xb[j].add(4 * c)) };
                                let xh = unsafe { broadcast(xb[j].add(16 + 4 * c)) };
                                isum[j] = q4_step(isum[j], lo, xl);
                                second[j] = q4_step(second[j], hi, xh);
                            }
                        }
                        for j in 0..N {
                            isum[j] = q4_sum(isum[j]);
                            second[j] = q4_sum(second[j]);
                        }
                    } else if format == QuantFormat::K6 {
                        // Codes of 0..63, the high nibbles (values 16..32) summed apart:
                        // a 16-bit shift lines each chunk's two high bits up with its
                        // nibbles (see `QuantFormat::K6`).
                        let high = unsafe { block.add(format.group_high_at()) };
                        let top = _mm256_set1_epi8(0x30);
                        for c in 0..4 {
                            let h = unsafe {
                                _mm256_loadu_si256(high.add(32 * (c / 2)) as *const __m256i)
                            };
                            let (lo_top, hi_top) = match c % 2 {
                                0 => (_mm256_slli_epi16(h, 4), _mm256_slli_epi16(h, 2)),
                                _ => (h, _mm256_srli_epi16(h, 2)),
                            };
                            let raw =
                                unsafe { _mm256_loadu_si256(codes.add(32 * c) as *const __m256i) };
                            let lo = _mm256_or_si256(
                                _mm256_and_si256(raw, mask),
                                _mm256_and_si256(lo_top, top),
                            );
                            let hi = _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask),
                                _mm256_and_si256(hi_top, top),
                            );
                            for j in 0..N {
                                let xl = unsafe { broadcast(xb[j].add(4 * c)) };
                                let xh = unsafe { broadcast(xb[j].add(16 + 4 * c)) };
                                isum[j] = q8_step(isum[j], lo, xl);
                                second[j] = q8_step(second[j], hi, xh);
                            }
                        }
                    } else if format.high_bytes() > 0 {
                        // Codes of 0..31: products too large for Q4's 16-bit sums.
                        let high = unsafe { block.add(format.group_high_at()) };
                        let qh = unsafe { _mm256_loadu_si256(high as *const __m256i) };
                        for c in 0..4 {
                            let raw =
                                unsafe { _mm256_loadu_si256(codes.add(32 * c) as *const __m256i) };
                            let k = 4 * c as i32;
                            let lo = _mm256_and_si256(raw, mask);
                            let lo = _mm256_or_si256(lo, high_bits_at(qh, k));
                            let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
                            let hi = _mm256_or_si256(hi, high_bits_at(qh, 16 + k));
                            for j in 0..N {
                                let xl = unsafe { broadcast(xb[j].add(4 * c)) };
                                let xh = unsafe { broadcast(xb[j].add(16 + 4 * c)) };
                                isum[j] = q8_step(q8_step(isum[j], lo, xl), hi, xh);
                            }
                        }
                    } else {
                        // Q4 and K4 sum both nibbles together.
                        for c in 0..4 {
                            let raw =
                                unsafe { _mm256_loadu_si256(codes.add(32 * c) as *const __m256i) };
                            let lo = _mm256_and_si256(raw, mask);
                            let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
                            for j in 0..N {
                                let xl = unsafe { broadcast(xb[j].add(4 * c)) };
                                let xh = unsafe { broadcast(xb[j].add(16 + 4 * c)) };
                                isum[j] = q4_step(q4_step(isum[j], lo, xl), hi, xh);
                            }
                        }
                        for j in 0..N {
                            isum[j] = q4_sum(isum[j]);
                        }
                    }
                    for j in 0..N {
                        let (xd, xs) =
                            unsafe { (*x[j].1.get_unchecked(b), *x[j].2.get_unchecked(b)) };
                        let xd = _mm256_set1_ps(xd);
                        let scale = _mm256_mul_ps(d, xd);
                        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), scale, acc[j]);
                        if format.half_scales() {
                            let scale = _mm256_mul_ps(m, xd);
                            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(second[j]), scale, acc[j]);
                        }
                        if format.half_mins() {
                            let (h0, h1) = unsafe {
                                (
                                    *x[j].3.get_unchecked(2 * b),
                                    *x[j].3.get_unchecked(2 * b + 1),
                                )
                            };
                            acc[j] = _mm256_fmadd_ps(m0, _mm256_set1_ps(h0), acc[j]);
                            acc[j] = _mm256_fmadd_ps(m1, _mm256_set1_ps(h1), acc[j]);
                        } else if format.has_offset() {
                            acc[j] = _mm256_fmadd_ps(m, _mm256_set1_ps(xs), acc[j]);
                        }
                    }
                }
                for j in 0..N {
                    // SAFETY: out[j] holds LANES values.
                    unsafe { _mm256_storeu_ps(out[j].as_mut_ptr(), acc[j]) };
                }
            }

            /// A group's scales in FP32 (see `crate::dot::expand_scales`).
            ///
            /// # Safety
            /// The CPU has the level's features; `group` holds `nb` group-blocks of
            /// `format` and their super entries, `out` `expanded_vectors` a block.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn expand(
                format: QuantFormat,
                group: &[u8],
                nb: usize,
                out: &mut [[f32; LANES]],
            ) {
                let (gbb, k) = (format.group_block_bytes(), format.expanded_vectors());
                debug_assert!(group.len() >= format.group_bytes(nb) && out.len() >= k * nb);
                let mut sup = [_mm256_setzero_ps(); 2];
                for b in 0..nb {
                    // SAFETY: within the group and `out`, as the caller guarantees.
                    unsafe {
                        let block = group.as_ptr().add(b * gbb);
                        if format.super_scales() && b % SUPER_GROUPS == 0 {
                            sup = super_halves(super_entry(format, group, nb, b).as_ptr());
                        }
                        let (d, m) = block_scales(format, block, sup);
                        let v = out.as_mut_ptr().add(k * b) as *mut f32;
                        _mm256_storeu_ps(v, d);
                        _mm256_storeu_ps(v.add(LANES), m);
                        if format.half_mins() {
                            let (m0, m1) = half_mins(format, block, sup, (d, m));
                            _mm256_storeu_ps(v.add(2 * LANES), m0);
                            _mm256_storeu_ps(v.add(3 * LANES), m1);
                        }
                    }
                }
            }

            tokens_by_tile!($features);
        }
    };
}

level!(avx2, "avx2,fma,f16c",
    // Q4 products fit in 16 bits for a whole block: 8 chunks x 2 x 15 x 127 < 32768.
    q4: |a, w, x| _mm256_add_epi16(a, _mm256_maddubs_epi16(w, x)),
    q4_sum: |s| _mm256_madd_epi16(s, _mm256_set1_epi16(1)),
    q8: |a, w, x| _mm256_add_epi32(
        a,
        _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
    )
);

level!(vnni, "avx2,fma,f16c,avx512vnni,avx512vl",
    q4: |a, w, x| _mm256_dpbusd_epi32(a, w, x),
    q4_sum: |s| s,
    q8: |a, w, x| _mm256_dpbusd_epi32(a, w, x)
);
