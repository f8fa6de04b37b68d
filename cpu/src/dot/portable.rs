//! The plain-Rust level: any CPU, and the kernels' own reference. The same arithmetic as
//! the SIMD levels lane for lane (fused multiply-adds in the same order), so every level
//! gives the same results.

use std::ops::Range;

use crate::activations::Q8Activations;
use crate::format::{with_high_bits, QuantFormat, QBLOCK};
use crate::interleaved::{block_lanes, code_offset, LANES};

/// `sum(q_w q_x)` of lane `l` over chunks `chunks` of one group-block (Q4 codes read as
/// 0..15, Q5_0's as 0..31, K6's as 0..63), of the nibble formats' values `halves` (0:
/// `j < 16` from the low nibbles, 1: the high ones).
fn lane_isum(
    format: QuantFormat,
    block: &[u8],
    l: usize,
    x: &[i8],
    chunks: Range<usize>,
    halves: Range<usize>,
) -> i32 {
    let codes = &block[format.group_codes_at()..];
    let high_at = format.group_high_at();
    let high: Vec<u8> = (0..format.high_bytes())
        .map(|i| block[high_at + code_offset(l, i)])
        .collect();
    let mut sum = 0i32;
    for c in chunks {
        for i in 0..4 {
            let byte = codes[32 * c + 4 * l + i];
            let k = 4 * c + i;
            sum += match format.signed_codes() {
                true => i32::from(byte as i8) * i32::from(x[k]),
                _ => {
                    let (lo, hi) = with_high_bits(format, byte, &high, k);
                    let values = [(lo, x[k]), (hi, x[k + 16])];
                    values[halves.clone()]
                        .iter()
                        .map(|&(q, x)| i32::from(q) * i32::from(x))
                        .sum()
                }
            };
        }
    }
    sum
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
    let chunks = (format.code_bytes() - format.high_bytes()) / 4;
    for (j, o) in out[..n].iter_mut().enumerate() {
        let (q, xd, xs, xh) = acts.token(t0 + j);
        *o = [0.0; LANES];
        for (b, block) in group[..nb * gbb].chunks_exact(gbb).enumerate() {
            let [d, m, m0, m1] = block_lanes(format, group, nb, b, scales);
            let x = &q[b * QBLOCK..(b + 1) * QBLOCK];
            for (l, acc) in o.iter_mut().enumerate() {
                if format == QuantFormat::K8 {
                    // One scale per half: chunks 0..4 hold values 0..16.
                    let first = lane_isum(format, block, l, x, 0..4, 0..2);
                    let second = lane_isum(format, block, l, x, 4..8, 0..2);
                    *acc = (first as f32).mul_add(d[l] * xd[b], *acc);
                    *acc = (second as f32).mul_add(m[l] * xd[b], *acc);
                    continue;
                }
                if format.half_mins() {
                    // A scale and a min per half: the low nibbles hold values 0..16.
                    let first = lane_isum(format, block, l, x, 0..chunks, 0..1);
                    let second = lane_isum(format, block, l, x, 0..chunks, 1..2);
                    *acc = (first as f32).mul_add(d[l] * xd[b], *acc);
                    *acc = (second as f32).mul_add(m[l] * xd[b], *acc);
                    *acc = m0[l].mul_add(xh[2 * b], *acc);
                    *acc = m1[l].mul_add(xh[2 * b + 1], *acc);
                    continue;
                }
                let isum = lane_isum(format, block, l, x, 0..chunks, 0..2);
                *acc = (isum as f32).mul_add(d[l] * xd[b], *acc);
                if format.has_offset() {
                    *acc = m[l].mul_add(xs[b], *acc);
                }
            }
        }
    }
}
