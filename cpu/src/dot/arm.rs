//! arm64 levels: NEON (`smull` + pairwise adds, any arm64) and NEON with the dot-product
//! extension (`sdot`), stamped from one body; they differ only in how a chunk's integer
//! products are summed, and integer sums are exact, so both give identical results (and
//! the same as the other levels).
//!
//! A group-block's eight rows sit in two vectors of four lanes (see
//! `crate::interleaved`): each half of a 32-byte chunk of codes holds four bytes of four
//! rows, multiplied by the token's four matching activation bytes broadcast to every lane.
//! Q4 and K4 codes (0..15), K2's and K3's (0..3, 0..7), Q5_0's, Q5_1's and K5's (0..31,
//! the high bits spread into bytes), K6's (0..63) and Q8_0 and K8 codes all multiply as
//! signed bytes.

macro_rules! level {
    ($name:ident, $features:literal, |$a:ident, $w:ident, $x:ident| $step:expr) => {
        pub(super) mod $name {
            use std::arch::aarch64::*;

            use crate::format::{QuantFormat, QBLOCK};
            use crate::interleaved::{block_lanes, LANES};

            /// Adds to each `i32` lane of `a` the products of its four bytes of `w` and `x`.
            #[target_feature(enable = $features)]
            fn step($a: int32x4_t, $w: int8x16_t, $x: int8x16_t) -> int32x4_t {
                $step
            }

            /// Bits `k..k + 4` of each lane's word in `qh`, as bytes of 16 or 0 (byte `i`
            /// from bit `k + i`): the fifth bit of four Q5_0 codes.
            #[target_feature(enable = $features)]
            fn high_bits_at(qh: uint32x4_t, k: i32) -> int8x16_t {
                let t = vreinterpretq_u8_u32(vshlq_u32(qh, vdupq_n_s32(-k)));
                let low_byte: [u8; 16] = [0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12];
                // SAFETY: sixteen bytes.
                let rep = vqtbl1q_u8(t, unsafe { vld1q_u8(low_byte.as_ptr()) });
                let bits = vreinterpretq_u8_u32(vdupq_n_u32(0x0804_0201));
                vreinterpretq_s8_u8(vandq_u8(vtstq_u8(rep, bits), vdupq_n_u8(16)))
            }

            /// Four activation bytes in every lane.
            #[target_feature(enable = $features)]
            unsafe fn broadcast(x: *const i8) -> int8x16_t {
                // SAFETY: the caller passes four readable bytes.
                vreinterpretq_s8_s32(vdupq_n_s32(unsafe { (x as *const i32).read_unaligned() }))
            }

            /// `N` tokens against one group of eight rows: `out[j][l] = row l · x[j]`.
            ///
            /// # Safety
            /// The CPU has the level's features; `group` holds `nb` group-blocks of
            /// `QuantFormat::ALL[F]` and each token `nb` blocks.
            #[target_feature(enable = $features)]
            unsafe fn tile<const N: usize, const F: usize>(
                group: &[u8],
                nb: usize,
                x: [crate::activations::TokenActs<'_>; N],
                out: &mut [[f32; LANES]],
                scales: Option<&[[f32; LANES]]>,
            ) {
                let format = QuantFormat::ALL[F];
                let (gbb, codes_at) = (format.group_block_bytes(), format.group_codes_at());
                let mut acc = [[vdupq_n_f32(0.0); 2]; N];
                let mask = vdupq_n_u8(15);
                for b in 0..nb {
                    let block = &group[b * gbb..(b + 1) * gbb];
                    let [d, m, m0, m1] = block_lanes(format, group, nb, b, scales);
                    // SAFETY (every load below): within the group-block and each token's
                    // block `b`, as the caller guarantees.
                    let (d, m) = unsafe {
                        (
                            [vld1q_f32(d.as_ptr()), vld1q_f32(d.as_ptr().add(4))],
                            [vld1q_f32(m.as_ptr()), vld1q_f32(m.as_ptr().add(4))],
                        )
                    };
                    let codes = unsafe { block.as_ptr().add(codes_at) };
                    let xb: [*const i8; N] =
                        std::array::from_fn(|j| unsafe { x[j].0.as_ptr().add(QBLOCK * b) });
                    // K8 sums its two halves of values apart (one scale each): `second`
                    // holds chunks 4..8 there.
                    let mut isum = [[vdupq_n_s32(0); 2]; N];
                    let mut second = [[vdupq_n_s32(0); 2]; N];
                    if format.signed_codes() {
                        let split = if format == QuantFormat::K8 { 4 } else { 8 };
                        for c in 0..8 {
                            let sums = if c < split { &mut isum } else { &mut second };
                            for h in 0..2 {
                                let w =
                                    unsafe { vld1q_s8(codes.add(32 * c + 16 * h) as *const i8) };
                                for j in 0..N {
                                    let xv = unsafe { broadcast(xb[j].add(4 * c)) };
                                    sums[j][h] = step(sums[j][h], w, xv);
                                }
                            }
                        }
                    } else {
                        // Q5_0's, Q5_1's and K5's high-bit words, four lanes a half (zero
                        // for Q4); K6's high bytes, two chunks' worth a vector.
                        let high = unsafe { block.as_ptr().add(format.group_high_at()) };
                        let qh = match format.high_bytes() == 4 && !format.crumbs() {
                            true => {
                                [0, 1].map(|h| unsafe { vld1q_u32(high.add(16 * h) as *const u32) })
                            }
                            false => [vdupq_n_u32(0); 2],
                        };
                        for c in 0..4 {
                            for h in 0..2 {
                                let k = 4 * c as i32;
                                let (mut lo, mut hi) = match format.crumbs() {
                                    // Crumbs shifted down, K3's third bits beside them
                                    // (see `QuantFormat::K2`, `QuantFormat::K3`).
                                    true => unsafe {
                                        let down = |v: uint8x16_t, n: usize| {
                                            vshlq_u8(v, vdupq_n_s8(-(n as i8)))
                                        };
                                        let three = vdupq_n_u8(3);
                                        let l = vld1q_u8(codes.add(16 * h));
                                        let u = vld1q_u8(codes.add(32 + 16 * h));
                                        let mut lo = vandq_u8(down(l, 2 * c), three);
                                        let mut hi = vandq_u8(down(u, 2 * c), three);
                                        if format == QuantFormat::K3 {
                                            let t = vld1q_u8(high.add(16 * h));
                                            let bit = |n: usize| {
                                                vshlq_n_u8(vandq_u8(down(t, n), vdupq_n_u8(1)), 2)
                                            };
                                            lo = vorrq_u8(lo, bit(c));
                                            hi = vorrq_u8(hi, bit(4 + c));
                                        }
                                        (lo, hi)
                                    },
                                    false => {
                                        let raw = unsafe { vld1q_u8(codes.add(32 * c + 16 * h)) };
                                        (vandq_u8(raw, mask), vshrq_n_u8(raw, 4))
                                    }
                                };
                                if format == QuantFormat::K6 {
                                    // Two high bits a value, shifted into place (see
                                    // `QuantFormat::K6`).
                                    let t = unsafe { vld1q_u8(high.add(32 * (c / 2) + 16 * h)) };
                                    let top = vdupq_n_u8(0x30);
                                    let (lt, ht) = match c % 2 {
                                        0 => (vshlq_n_u8(t, 4), vshlq_n_u8(t, 2)),
                                        _ => (t, vshrq_n_u8(t, 2)),
                                    };
                                    lo = vorrq_u8(lo, vandq_u8(lt, top));
                                    hi = vorrq_u8(hi, vandq_u8(ht, top));
                                }
                                let lo = vorrq_s8(vreinterpretq_s8_u8(lo), high_bits_at(qh[h], k));
                                let hi =
                                    vorrq_s8(vreinterpretq_s8_u8(hi), high_bits_at(qh[h], 16 + k));
                                for j in 0..N {
                                    let xl = unsafe { broadcast(xb[j].add(4 * c)) };
                                    let xh = unsafe { broadcast(xb[j].add(16 + 4 * c)) };
                                    if format.half_scales() {
                                        // K2, K3, K6: values 16..32 apart.
                                        isum[j][h] = step(isum[j][h], lo, xl);
                                        second[j][h] = step(second[j][h], hi, xh);
                                    } else {
                                        isum[j][h] = step(step(isum[j][h], lo, xl), hi, xh);
                                    }
                                }
                            }
                        }
                    }
                    let mins = match format.half_mins() {
                        true => {
                            // SAFETY: eight values each.
                            let v = |m: &[f32; LANES], h: usize| unsafe {
                                vld1q_f32(m.as_ptr().add(4 * h))
                            };
                            [[v(&m0, 0), v(&m0, 1)], [v(&m1, 0), v(&m1, 1)]]
                        }
                        false => [[vdupq_n_f32(0.0); 2]; 2],
                    };
                    for j in 0..N {
                        let (xd, xs) = (x[j].1[b], x[j].2[b]);
                        for h in 0..2 {
                            let scale = vmulq_f32(d[h], vdupq_n_f32(xd));
                            acc[j][h] = vfmaq_f32(acc[j][h], vcvtq_f32_s32(isum[j][h]), scale);
                            if format.half_scales() {
                                let scale = vmulq_f32(m[h], vdupq_n_f32(xd));
                                let s = vcvtq_f32_s32(second[j][h]);
                                acc[j][h] = vfmaq_f32(acc[j][h], s, scale);
                            }
                            if format.half_mins() {
                                let (h0, h1) = (x[j].3[2 * b], x[j].3[2 * b + 1]);
                                acc[j][h] = vfmaq_f32(acc[j][h], mins[0][h], vdupq_n_f32(h0));
                                acc[j][h] = vfmaq_f32(acc[j][h], mins[1][h], vdupq_n_f32(h1));
                            } else if format.has_offset() {
                                acc[j][h] = vfmaq_f32(acc[j][h], m[h], vdupq_n_f32(xs));
                            }
                        }
                    }
                }
                for j in 0..N {
                    // SAFETY: out[j] holds LANES = 8 values.
                    unsafe {
                        vst1q_f32(out[j].as_mut_ptr(), acc[j][0]);
                        vst1q_f32(out[j].as_mut_ptr().add(4), acc[j][1]);
                    }
                }
            }

            tokens_by_tile!($features);
        }
    };
}

level!(neon, "neon", |a, w, x| {
    let lo = vmull_s8(vget_low_s8(w), vget_low_s8(x));
    let hi = vmull_high_s8(w, x);
    vaddq_s32(a, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)))
});

level!(dotprod, "neon,dotprod", |a, w, x| {
    let mut a = a;
    // SAFETY: `sdot` reads and writes registers only; the level has the extension.
    unsafe {
        std::arch::asm!(
            "sdot {a:v}.4s, {w:v}.16b, {x:v}.16b",
            a = inout(vreg) a,
            w = in(vreg) w,
            x = in(vreg) x,
            options(pure, nomem, nostack)
        );
    }
    a
});
