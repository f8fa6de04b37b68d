//! The wasm32 level: 128-bit SIMD (`simd128`), compiled in when the module is built with
//! it (the browser demo is) and used by every browser that runs such a module.
//!
//! The layout is NEON's (see `arm`): a group-block's eight rows sit in two vectors of four
//! `i32` lanes, each half of a 32-byte chunk of codes holding four bytes of four rows,
//! multiplied by the token's four matching activation bytes broadcast to every lane.
//! simd128 has no byte dot product, so a step widens the bytes to 16 bits and takes
//! `i32x4.dot_i16x8_s`: sums of pairs of products, each row's two pairs in neighbouring
//! lanes, added together once a block. WebAssembly has
//! no fused multiply-add either: the scales are applied with a multiply and an add, as
//! the portable level does on wasm, so both give identical results here. Nor has it a
//! half-to-single conversion: the scales' IEEE halves are widened with integer shifts
//! and one exact multiply.

pub(super) mod simd128 {
    use std::arch::wasm32::*;

    use crate::format::{QuantFormat, QBLOCK, SUPER_GROUPS};
    use crate::interleaved::{super_entry, LANES};

    /// Eight FP32 values, lanes 0..4 and 4..8.
    type Eight = [v128; 2];

    /// A half's integer sums in pairs: rows 0 and 1 of the four in `[0]` (each row's two
    /// pairs of products side by side), rows 2 and 3 in `[1]`.
    type Pairs = [v128; 2];

    /// Adds to `a` the products of each row's four bytes of `w` and the four activation
    /// bytes `x` (widened to 16 bits, twice over).
    #[inline(always)]
    fn step(a: Pairs, w: v128, x: v128) -> Pairs {
        [
            i32x4_add(a[0], i32x4_dot_i16x8(i16x8_extend_low_i8x16(w), x)),
            i32x4_add(a[1], i32x4_dot_i16x8(i16x8_extend_high_i8x16(w), x)),
        ]
    }

    /// The four rows' sums, in FP32.
    #[inline(always)]
    fn rows(a: Pairs) -> v128 {
        let sums = i32x4_add(
            i32x4_shuffle::<0, 2, 4, 6>(a[0], a[1]),
            i32x4_shuffle::<1, 3, 5, 7>(a[0], a[1]),
        );
        f32x4_convert_i32x4(sums)
    }

    /// Bits `k..k + 4` of each lane's word in `qh`, as bytes of 16 or 0 (byte `i` from
    /// bit `k + i`): the fifth bit of four Q5_0 codes.
    #[inline(always)]
    fn high_bits_at(qh: v128, k: u32) -> v128 {
        let t = u32x4_shr(qh, k);
        let rep = i8x16_swizzle(t, u8x16(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12));
        let bits = u32x4_splat(0x0804_0201);
        let set = i8x16_eq(v128_and(rep, bits), bits);
        v128_and(set, u8x16_splat(16))
    }

    /// Sixteen bytes at `p`.
    ///
    /// # Safety
    /// `p` points to sixteen readable bytes.
    #[inline(always)]
    unsafe fn load(p: *const u8) -> v128 {
        // SAFETY: as the caller guarantees; `v128_load` takes unaligned addresses.
        unsafe { v128_load(p as *const v128) }
    }

    /// Four IEEE halves (in the low 16 bits of each `u32` lane) as FP32: the magnitude's
    /// bits moved into FP32 position are the value times 2^-112 (a subnormal one for the
    /// halves' subnormals), so one multiply by 2^112 gives it exactly; infinities and NaN
    /// (never a scale) come out finite.
    #[inline(always)]
    fn widen_halves(h: v128) -> v128 {
        let sign = i32x4_shl(v128_and(h, u32x4_splat(0x8000)), 16);
        let magnitude = i32x4_shl(v128_and(h, u32x4_splat(0x7fff)), 13);
        v128_or(
            f32x4_mul(magnitude, f32x4_splat(f32::from_bits(0x7780_0000))),
            sign,
        )
    }

    /// Eight IEEE halves at `p`, in FP32.
    ///
    /// # Safety
    /// `p` points to sixteen readable bytes.
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> Eight {
        // SAFETY: as the caller guarantees.
        let h = unsafe { load(p) };
        [
            widen_halves(u32x4_extend_low_u16x8(h)),
            widen_halves(u32x4_extend_high_u16x8(h)),
        ]
    }

    /// Scale steps `s` of a K format's group-block's eight rows (signed bytes), in FP32.
    ///
    /// # Safety
    /// `block` starts a group-block of a K format with at least `s + 1` steps.
    #[inline(always)]
    unsafe fn steps(block: *const u8, s: usize) -> Eight {
        // SAFETY: eight signed bytes per step lead the group-block.
        let bytes = unsafe { v128_load64_zero(block.add(LANES * s) as *const u64) };
        let words = i16x8_extend_low_i8x16(bytes);
        [
            f32x4_convert_i32x4(i32x4_extend_low_i16x8(words)),
            f32x4_convert_i32x4(i32x4_extend_high_i16x8(words)),
        ]
    }

    fn mul(a: Eight, b: Eight) -> Eight {
        [f32x4_mul(a[0], b[0]), f32x4_mul(a[1], b[1])]
    }

    fn by(a: Eight, s: f32) -> Eight {
        a.map(|v| f32x4_mul(v, f32x4_splat(s)))
    }

    /// A group-block's two scale vectors, `d` and `m` (see `crate::dot`; K8, K2, K3,
    /// K6: the second half's `d`); `sup` its super-block's `d` and `-dmin` (the K
    /// formats). The products of `QuantFormat::block_scales`, in its order.
    ///
    /// # Safety
    /// `block` starts a group-block of `format`.
    #[inline(always)]
    unsafe fn block_scales(format: QuantFormat, block: *const u8, sup: [Eight; 2]) -> [Eight; 2] {
        // SAFETY: the scales lead the group-block.
        unsafe {
            if format.super_scales() {
                let second = match format.half_scales() {
                    true => sup[0],
                    false => sup[1],
                };
                return [mul(sup[0], steps(block, 0)), mul(second, steps(block, 1))];
            }
            let d = halves(block);
            let m = match format {
                QuantFormat::Q4_1 | QuantFormat::Q5_1 => halves(block.add(2 * LANES)),
                f => by(d, f.offset(1.0)),
            };
            [d, m]
        }
    }

    /// The mins of the first and the second half: K2's steps 2 and 3 times `-dmin`,
    /// K6's `-32 d_h` and K3's `-4 d_h` from their halves' scales `[d, m]`; zeros for
    /// the other formats.
    ///
    /// # Safety
    /// `block` starts a group-block of `format`.
    #[inline(always)]
    unsafe fn half_mins(
        format: QuantFormat,
        block: *const u8,
        sup: [Eight; 2],
        [d, m]: [Eight; 2],
    ) -> [Eight; 2] {
        match format {
            // SAFETY: four runs of steps lead the group-block.
            QuantFormat::K2 => unsafe {
                [mul(sup[1], steps(block, 2)), mul(sup[1], steps(block, 3))]
            },
            QuantFormat::K6 => [by(d, -32.0), by(m, -32.0)],
            QuantFormat::K3 => [by(d, -4.0), by(m, -4.0)],
            _ => [[f32x4_splat(0.0); 2]; 2],
        }
    }

    /// Group-block `b`'s `[d, m]` and half mins: from `scales` (the group's expanded
    /// scales) where given, else from the group-block, reading its super entry into `sup`
    /// at the start of each super-block.
    ///
    /// # Safety
    /// `group` holds `nb` group-blocks of `format` and their super entries; `scales`,
    /// where given, `format.expanded_vectors()` vectors a block.
    #[inline(always)]
    unsafe fn scales_of(
        format: QuantFormat,
        group: &[u8],
        nb: usize,
        b: usize,
        scales: Option<&[[f32; LANES]]>,
        sup: &mut [Eight; 2],
    ) -> ([Eight; 2], [Eight; 2]) {
        // SAFETY: within the group and the scales, as the caller guarantees.
        unsafe {
            match scales {
                Some(s) => {
                    let k = format.expanded_vectors();
                    let v = |i: usize| {
                        let p = s[k * b + i].as_ptr() as *const u8;
                        [load(p), load(p.add(16))]
                    };
                    let mins = match format.half_mins() {
                        true => [v(2), v(3)],
                        false => [[f32x4_splat(0.0); 2]; 2],
                    };
                    ([v(0), v(1)], mins)
                }
                None => {
                    if format.super_scales() && b % SUPER_GROUPS == 0 {
                        let entry = super_entry(format, group, nb, b).as_ptr();
                        *sup = [halves(entry), halves(entry.add(2 * LANES))];
                    }
                    let block = group.as_ptr().add(b * format.group_block_bytes());
                    let dm = block_scales(format, block, *sup);
                    (dm, half_mins(format, block, *sup, dm))
                }
            }
        }
    }

    /// Group `g`'s scales into `out`, as `crate::dot::expand_scales` lays them out.
    ///
    /// # Safety
    /// `group` holds `nb` group-blocks of `format` and their super entries, `out`
    /// `format.expanded_vectors()` vectors a block.
    #[target_feature(enable = "simd128")]
    pub(crate) unsafe fn expand(
        format: QuantFormat,
        group: &[u8],
        nb: usize,
        out: &mut [[f32; LANES]],
    ) {
        let k = format.expanded_vectors();
        debug_assert!(out.len() >= k * nb);
        let mut sup = [[f32x4_splat(0.0); 2]; 2];
        for b in 0..nb {
            // SAFETY: within the group and `out`, as the caller guarantees.
            unsafe {
                let ([d, m], [m0, m1]) = scales_of(format, group, nb, b, None, &mut sup);
                for (i, v) in [d, m, m0, m1].into_iter().take(k).enumerate() {
                    let p = out[k * b + i].as_mut_ptr() as *mut v128;
                    v128_store(p, v[0]);
                    v128_store(p.add(1), v[1]);
                }
            }
        }
    }

    /// Four activation bytes, widened to 16 bits, in both halves.
    ///
    /// # Safety
    /// `x` points to four readable bytes.
    #[inline(always)]
    unsafe fn broadcast(x: *const i8) -> v128 {
        // SAFETY: as the caller guarantees.
        i16x8_extend_low_i8x16(i32x4_splat(unsafe { (x as *const i32).read_unaligned() }))
    }

    /// `a + b c` in two roundings, as the portable level computes on wasm.
    #[inline(always)]
    fn madd(a: v128, b: v128, c: v128) -> v128 {
        f32x4_add(a, f32x4_mul(b, c))
    }

    /// `N` tokens against one group of eight rows: `out[j][l] = row l · x[j]`.
    ///
    /// # Safety
    /// `group` holds `nb` group-blocks of `QuantFormat::ALL[F]` and each token `nb`
    /// blocks.
    #[target_feature(enable = "simd128")]
    unsafe fn tile<const N: usize, const F: usize>(
        group: &[u8],
        nb: usize,
        x: [crate::activations::TokenActs<'_>; N],
        out: &mut [[f32; LANES]],
        scales: Option<&[[f32; LANES]]>,
    ) {
        let format = QuantFormat::ALL[F];
        let (gbb, codes_at) = (format.group_block_bytes(), format.group_codes_at());
        let zero = i32x4_splat(0);
        let mut acc = [[f32x4_splat(0.0); 2]; N];
        let mask = u8x16_splat(15);
        let mut sup = [[f32x4_splat(0.0); 2]; 2];
        for b in 0..nb {
            let block = &group[b * gbb..(b + 1) * gbb];
            // SAFETY: the group and the scales as the caller guarantees.
            let ([d, m], mins) = unsafe { scales_of(format, group, nb, b, scales, &mut sup) };
            // SAFETY (every load below): within the group-block and each token's block
            // `b`, as the caller guarantees.
            let codes = unsafe { block.as_ptr().add(codes_at) };
            let xb: [*const i8; N] =
                std::array::from_fn(|j| unsafe { x[j].0.as_ptr().add(QBLOCK * b) });
            // K8 sums its two halves of values apart (one scale each): `second` holds
            // chunks 4..8 there.
            let mut isum = [[[zero; 2]; 2]; N];
            let mut second = [[[zero; 2]; 2]; N];
            if format.signed_codes() {
                let split = if format == QuantFormat::K8 { 4 } else { 8 };
                for c in 0..8 {
                    let sums = if c < split { &mut isum } else { &mut second };
                    for h in 0..2 {
                        let w = unsafe { load(codes.add(32 * c + 16 * h)) };
                        for j in 0..N {
                            let xv = unsafe { broadcast(xb[j].add(4 * c)) };
                            sums[j][h] = step(sums[j][h], w, xv);
                        }
                    }
                }
            } else {
                // Q5_0's, Q5_1's and K5's high-bit words, four lanes a half (zero for Q4);
                // K6's high bytes, two chunks' worth a vector.
                let high = unsafe { block.as_ptr().add(format.group_high_at()) };
                let qh = match format.high_bytes() == 4 && !format.crumbs() {
                    true => [0, 1].map(|h| unsafe { load(high.add(16 * h)) }),
                    false => [zero; 2],
                };
                for c in 0..4 {
                    for h in 0..2 {
                        let k = 4 * c as u32;
                        let (mut lo, mut hi) = match format.crumbs() {
                            // Crumbs shifted down, K3's third bits beside them (see
                            // `QuantFormat::K2`, `QuantFormat::K3`).
                            true => unsafe {
                                let three = u8x16_splat(3);
                                let l = load(codes.add(16 * h));
                                let u = load(codes.add(32 + 16 * h));
                                let n = 2 * c as u32;
                                let mut lo = v128_and(u8x16_shr(l, n), three);
                                let mut hi = v128_and(u8x16_shr(u, n), three);
                                if format == QuantFormat::K3 {
                                    let t = load(high.add(16 * h));
                                    let bit = |n: u32| {
                                        i8x16_shl(v128_and(u8x16_shr(t, n), u8x16_splat(1)), 2)
                                    };
                                    lo = v128_or(lo, bit(c as u32));
                                    hi = v128_or(hi, bit(4 + c as u32));
                                }
                                (lo, hi)
                            },
                            false => {
                                let raw = unsafe { load(codes.add(32 * c + 16 * h)) };
                                (v128_and(raw, mask), u8x16_shr(raw, 4))
                            }
                        };
                        if format == QuantFormat::K6 {
                            // Two high bits a value, shifted into place (see
                            // `QuantFormat::K6`).
                            let t = unsafe { load(high.add(32 * (c / 2) + 16 * h)) };
                            let top = u8x16_splat(0x30);
                            let (lt, ht) = match c % 2 {
                                0 => (i8x16_shl(t, 4), i8x16_shl(t, 2)),
                                _ => (t, u8x16_shr(t, 2)),
                            };
                            lo = v128_or(lo, v128_and(lt, top));
                            hi = v128_or(hi, v128_and(ht, top));
                        }
                        let lo = v128_or(lo, high_bits_at(qh[h], k));
                        let hi = v128_or(hi, high_bits_at(qh[h], 16 + k));
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
            for j in 0..N {
                let (xd, xs) = (x[j].1[b], x[j].2[b]);
                for h in 0..2 {
                    let scale = f32x4_mul(d[h], f32x4_splat(xd));
                    acc[j][h] = madd(acc[j][h], rows(isum[j][h]), scale);
                    if format.half_scales() {
                        let scale = f32x4_mul(m[h], f32x4_splat(xd));
                        acc[j][h] = madd(acc[j][h], rows(second[j][h]), scale);
                    }
                    if format.half_mins() {
                        let (h0, h1) = (x[j].3[2 * b], x[j].3[2 * b + 1]);
                        acc[j][h] = madd(acc[j][h], mins[0][h], f32x4_splat(h0));
                        acc[j][h] = madd(acc[j][h], mins[1][h], f32x4_splat(h1));
                    } else if format.has_offset() {
                        acc[j][h] = madd(acc[j][h], m[h], f32x4_splat(xs));
                    }
                }
            }
        }
        for j in 0..N {
            // SAFETY: out[j] holds LANES = 8 values.
            unsafe {
                v128_store(out[j].as_mut_ptr() as *mut v128, acc[j][0]);
                v128_store(out[j].as_mut_ptr().add(4) as *mut v128, acc[j][1]);
            }
        }
    }

    tokens_by_tile!("simd128");
}
