//! The plain-Rust level: any CPU, and the kernels' own reference. The same arithmetic as
//! the SIMD levels lane for lane (fused multiply-adds in the same order), so every level
//! gives the same results.

use crate::activations::Q8Activations;
use crate::format::{QuantFormat, QBLOCK};
use crate::interleaved::{group_scales, LANES};

/// `sum(q_w q_x)` of lane `l` over one group-block's codes (Q4 codes read as 0..15).
fn lane_isum(format: QuantFormat, codes: &[u8], l: usize, x: &[i8]) -> i32 {
    let chunks = format.code_bytes() / 4;
    let mut sum = 0i32;
    for c in 0..chunks {
        for i in 0..4 {
            let byte = codes[32 * c + 4 * l + i];
            let k = 4 * c + i;
            sum += match format {
                QuantFormat::Q8_0 => i32::from(byte as i8) * i32::from(x[k]),
                _ => {
                    i32::from(byte & 15) * i32::from(x[k])
                        + i32::from(byte >> 4) * i32::from(x[k + 16])
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
) {
    let (gbb, codes_at) = (format.group_block_bytes(), format.group_codes_at());
    for (j, o) in out[..n].iter_mut().enumerate() {
        let (q, xd, xs) = acts.token(t0 + j);
        *o = [0.0; LANES];
        for (b, block) in group.chunks_exact(gbb).enumerate() {
            let (d, m) = group_scales(format, block);
            let x = &q[b * QBLOCK..(b + 1) * QBLOCK];
            for (l, acc) in o.iter_mut().enumerate() {
                let isum = lane_isum(format, &block[codes_at..], l, x);
                *acc = (isum as f32).mul_add(d[l] * xd[b], *acc);
                if format != QuantFormat::Q8_0 {
                    *acc = m[l].mul_add(xs[b], *acc);
                }
            }
        }
    }
}
