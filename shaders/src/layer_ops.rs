//! A layer's element-wise parts as single kernels: RMSNorm (burn runs six operations) and
//! SwiGLU's gate `silu(gate) * up` (burn runs four or more).

use cubecl::prelude::*;

/// Units per cube of [`rms_norm()`]: they share a row.
pub const NORM_UNITS: usize = 64;
/// Units per cube of [`swiglu()`].
pub const ELEMENT_UNITS: usize = 256;

/// The sum of `value` over the cube's `units` units (a power of two), through `partial`
/// (`units` long): a tree of halvings in workgroup memory. Every unit gets the sum.
#[cube]
pub fn cube_sum(
    partial: &mut SharedMemory<f32>,
    unit: usize,
    value: f32,
    #[comptime] units: usize,
) -> f32 {
    partial[unit] = value;
    sync_cube();
    #[unroll]
    for level in 0..comptime!(units.trailing_zeros() as usize) {
        let stride = comptime!(units >> (level + 1));
        if unit < stride {
            partial[unit] += partial[unit + stride];
        }
        sync_cube();
    }
    partial[0]
}

/// RMSNorm of row `CUBE_POS_X` of `x` (`[rows, d]`):
/// `out = x / sqrt(mean(x^2) + eps) * weight`. The units stride the row and meet in
/// workgroup memory to sum the squares.
#[cube(launch)]
pub fn rms_norm(x: &Array<f32>, weight: &Array<f32>, out: &mut Array<f32>, d: u32, eps: f32) {
    let row = CUBE_POS_X as usize;
    let unit = UNIT_POS_X as usize;
    let n = d as usize;
    let base = row * n;
    let mut partial = SharedMemory::<f32>::new(NORM_UNITS);
    let mut sum = 0.0;
    let mut i = unit;
    while i < n {
        let v = x[base + i];
        sum += v * v;
        i += NORM_UNITS;
    }
    let total = cube_sum(&mut partial, unit, sum, NORM_UNITS);
    let inv = 1.0 / f32::sqrt(total / f32::cast_from(d) + eps);
    let mut i = unit;
    while i < n {
        out[base + i] = x[base + i] * inv * weight[i];
        i += NORM_UNITS;
    }
}

/// `out[i] = silu(gate[i]) * up[i]` for `i < n`.
#[cube(launch)]
pub fn swiglu(gate: &Array<f32>, up: &Array<f32>, out: &mut Array<f32>, n: u32) {
    let i = ABSOLUTE_POS;
    if i < n as usize {
        let g = gate[i];
        out[i] = g / (1.0 + f32::exp(-g)) * up[i];
    }
}
