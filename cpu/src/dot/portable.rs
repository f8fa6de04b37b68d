//! The plain-Rust level: any CPU, and the kernels' own reference.

use half::f16;

use crate::activations::Q8Activations;
use crate::format::{QuantFormat, QBLOCK};

/// Block `b`'s `d` and `m` from the row's halves.
fn scales(format: QuantFormat, halves: &[u16], b: usize) -> (f32, f32) {
    let half = |i: usize| f16::from_bits(halves[i]).to_f32();
    match format {
        QuantFormat::Q4_1 => (half(2 * b), half(2 * b + 1)),
        QuantFormat::Q4_0 => (half(b), -8.0 * half(b)),
        QuantFormat::Q8_0 => (half(b), 0.0),
    }
}

/// `sum(q_w q_x)` over one block (Q4 codes read as 0..15).
fn block_isum(format: QuantFormat, codes: &[u8], x: &[i8]) -> i32 {
    match format {
        QuantFormat::Q8_0 => codes
            .iter()
            .zip(x)
            .map(|(&w, &x)| i32::from(w as i8) * i32::from(x))
            .sum(),
        QuantFormat::Q4_0 | QuantFormat::Q4_1 => codes
            .iter()
            .enumerate()
            .map(|(j, &byte)| {
                i32::from(byte & 15) * i32::from(x[j]) + i32::from(byte >> 4) * i32::from(x[j + 16])
            })
            .sum(),
    }
}

pub(super) fn row(
    format: QuantFormat,
    codes: &[u8],
    halves: &[u16],
    acts: &Q8Activations,
    out: &mut [f32],
) {
    let cb = format.code_bytes();
    let nb = acts.cols / QBLOCK;
    for (t, o) in out.iter_mut().enumerate() {
        let (q, xd, xs) = acts.token(t);
        let mut acc = 0.0f32;
        for b in 0..nb {
            let (d, m) = scales(format, halves, b);
            let isum = block_isum(format, &codes[b * cb..(b + 1) * cb], &q[b * QBLOCK..]);
            acc += d * xd[b] * isum as f32 + m * xs[b];
        }
        *o = acc;
    }
}
