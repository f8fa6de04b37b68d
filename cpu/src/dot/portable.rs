//! The plain-Rust level: any CPU, and the kernels' own reference. The same arithmetic as
//! the SIMD levels lane for lane (fused multiply-adds in the same order), so every level
//! gives the same results. WebAssembly has no fused multiply-add (a call to `fmaf` there
//! is software, many times slower): on wasm this level and `simd128` both multiply, then
//! add.

use std::ops::Range;

use crate::activations::Q8Activations;
use crate::format::{QuantFormat, QBLOCK};
use crate::interleaved::{block_lanes, code_offset, LANES};

/// `a b + c`: fused where the target has the instruction.
#[inline(always)]
fn madd(a: f32, b: f32, c: f32) -> f32 {
    match cfg!(target_family = "wasm") {
        true => a * b + c,
        false => a.mul_add(b, c),
    }
}

/// Lane `l`'s 32 integer codes in a group-block (see `QuantFormat::block_codes`).
fn lane_codes(format: QuantFormat, block: &[u8], l: usize) -> [i32; 32] {
    let hb = format.high_bytes();
    let (high_at, codes_at) = (format.group_high_at(), format.group_codes_at());
    let high = (0..hb).map(|i| block[high_at + code_offset(l, i)]);
    let codes = (0..format.code_bytes() - hb).map(|i| block[codes_at + code_offset(l, i)]);
    format.block_codes(&high.chain(codes).collect::<Vec<u8>>())
}

/// Tokens `t0..t0 + n` against one group of eight rows: `out[j][l] = row l · x[t0 + j]`.
pub(super) fn tokens(
    format: QuantFormat,
    group: &[u8],
    acts: &Q8Activations,
    t0: usize,
    n: usize,
    out: &mut [[f32; LANES]],
    scales: Option<&[[f32; LANES]]>,
) {
    let (gbb, nb) = (format.group_block_bytes(), acts.cols / QBLOCK);
    for (j, o) in out[..n].iter_mut().enumerate() {
        let (q, xd, xs, xh) = acts.token(t0 + j);
        *o = [0.0; LANES];
        for (b, block) in group[..nb * gbb].chunks_exact(gbb).enumerate() {
            let [d, m, m0, m1] = block_lanes(format, group, nb, b, scales);
            let x = &q[b * QBLOCK..(b + 1) * QBLOCK];
            for (l, acc) in o.iter_mut().enumerate() {
                let w = lane_codes(format, block, l);
                let dot = |r: Range<usize>| r.map(|j| w[j] * i32::from(x[j])).sum::<i32>();
                if format.half_scales() {
                    // One scale per half of 16 values, summed apart; K2's, K3's and K6's
                    // offsets per half.
                    *acc = madd(dot(0..16) as f32, d[l] * xd[b], *acc);
                    *acc = madd(dot(16..32) as f32, m[l] * xd[b], *acc);
                    if format.half_mins() {
                        *acc = madd(m0[l], xh[2 * b], *acc);
                        *acc = madd(m1[l], xh[2 * b + 1], *acc);
                    }
                    continue;
                }
                let isum = dot(0..32);
                *acc = madd(isum as f32, d[l] * xd[b], *acc);
                if format.has_offset() {
                    *acc = madd(m[l], xs[b], *acc);
                }
            }
        }
    }
}
