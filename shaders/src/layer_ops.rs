//! A layer's element-wise parts as single kernels: RMSNorm (burn runs six operations),
//! SwiGLU's gate `silu(gate) * up` (burn runs four or more), and for blocks the product
//! epilogues cannot finish (Gemma's) the per-head norms with RoPE and the KV write, and a
//! norm of a block's output with its residual add and the next norm. Inputs have the float
//! type `X` and the normed outputs `O`; weights, tables, the residual stream and the KV
//! arenas are FP32, as are sums and statistics.

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

/// `1 / sqrt(mean(x[base..base + n]^2) + eps)`, the units of the cube striding the
/// slice and meeting in `partial` (`NORM_UNITS` long). Every unit gets it.
#[cube]
pub fn inverse_rms<F: Float>(
    x: &Array<F>,
    base: usize,
    n: usize,
    eps: f32,
    partial: &mut SharedMemory<f32>,
    unit: usize,
) -> f32 {
    let mut sum = 0.0;
    let mut i = unit;
    while i < n {
        let v = f32::cast_from(x[base + i]);
        sum += v * v;
        i += NORM_UNITS;
    }
    let total = cube_sum(partial, unit, sum, NORM_UNITS);
    1.0 / f32::sqrt(total / f32::cast_from(n) + eps)
}

/// RMSNorm of row `CUBE_POS_X` of `x` (`[rows, d]`):
/// `out = x / sqrt(mean(x^2) + eps) * weight`. The units stride the row and meet in
/// workgroup memory to sum the squares.
#[cube(launch)]
pub fn rms_norm<X: Float, O: Float>(
    x: &Array<X>,
    weight: &Array<f32>,
    out: &mut Array<O>,
    d: u32,
    eps: f32,
) {
    let row = CUBE_POS_X as usize;
    let unit = UNIT_POS_X as usize;
    let n = d as usize;
    let base = row * n;
    let mut partial = SharedMemory::<f32>::new(NORM_UNITS);
    let inv = inverse_rms(x, base, n, eps, &mut partial, unit);
    let mut i = unit;
    while i < n {
        out[base + i] = O::cast_from(f32::cast_from(x[base + i]) * inv * weight[i]);
        i += NORM_UNITS;
    }
}

/// `out[i] = silu(gate[i]) * up[i]` for `i < n`.
#[cube(launch)]
pub fn swiglu<F: Float>(gate: &Array<F>, up: &Array<F>, out: &mut Array<F>, n: u32) {
    let i = ABSOLUTE_POS;
    if i < n as usize {
        let g = f32::cast_from(gate[i]);
        out[i] = F::cast_from(g / (1.0 + f32::exp(-g)) * f32::cast_from(up[i]));
    }
}

/// Head `CUBE_POS_X` (of `heads` query heads then `kv_heads` key heads) of token
/// `CUBE_POS_Y`'s row of `qkv` (`[tokens, (heads + 2 kv_heads) head_dim]`, `[q | k | v]`):
/// RMSNorm over the head with `q_norm` or `k_norm` when `normed`, then RoPE at position
/// `info[2 t]` (`table[pos * head_dim + 2 i]` cos and the next value sin of angle `i`;
/// angle `i` pairs dimensions `2 i, 2 i + 1`, or `i, i + head_dim / 2` when `neox`). Query
/// heads go to `out` (`[tokens, heads * head_dim]`); a key head goes to the FP32 arena
/// `keys` at row `info[2 t + 1]`, and its value head, as it is, to `values`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn qkv_heads<X: Float, O: Float>(
    qkv: &Array<X>,
    q_norm: &Array<f32>,
    k_norm: &Array<f32>,
    out: &mut Array<O>,
    keys: &mut Array<f32>,
    values: &mut Array<f32>,
    info: &Array<u32>,
    table: &Array<f32>,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    eps: f32,
    #[comptime] normed: bool,
    #[comptime] neox: bool,
) {
    let head = CUBE_POS_X as usize;
    let t = CUBE_POS_Y as usize;
    let unit = UNIT_POS_X as usize;
    let hd = head_dim as usize;
    let heads = heads as usize;
    let q_width = heads * hd;
    let kv_width = kv_heads as usize * hd;
    let src = t * (q_width + 2 * kv_width) + head * hd;
    let is_query = head < heads;
    let kv_head = head - select(is_query, head, heads);
    let pos = info[2 * t] as usize;
    let slot = info[2 * t + 1] as usize;
    let mut partial = SharedMemory::<f32>::new(NORM_UNITS);
    let mut scale = f32::new(1.0);
    if comptime!(normed) {
        scale = inverse_rms(qkv, src, hd, eps, &mut partial, unit);
    }
    let half = hd / 2;
    let mut j = unit;
    while j < half {
        let mut ia = 2 * j;
        let mut ib = 2 * j + 1;
        if comptime!(neox) {
            ia = j;
            ib = j + half;
        }
        let mut a = f32::cast_from(qkv[src + ia]) * scale;
        let mut b = f32::cast_from(qkv[src + ib]) * scale;
        if comptime!(normed) {
            if is_query {
                a *= q_norm[ia];
                b *= q_norm[ib];
            } else {
                a *= k_norm[ia];
                b *= k_norm[ib];
            }
        }
        let c = table[pos * hd + 2 * j];
        let s = table[pos * hd + 2 * j + 1];
        let ra = a * c - b * s;
        let rb = a * s + b * c;
        if is_query {
            out[t * q_width + head * hd + ia] = O::cast_from(ra);
            out[t * q_width + head * hd + ib] = O::cast_from(rb);
        } else {
            keys[slot * kv_width + kv_head * hd + ia] = ra;
            keys[slot * kv_width + kv_head * hd + ib] = rb;
        }
        j += NORM_UNITS;
    }
    if !is_query {
        // The value head lies a K's width after its key head.
        let mut i = unit;
        while i < hd {
            values[slot * kv_width + kv_head * hd + i] = f32::cast_from(qkv[src + kv_width + i]);
            i += NORM_UNITS;
        }
    }
}

/// Row `CUBE_POS_X` of a block's output `a` (`[rows, d]`) normed with `post` and added
/// to `residual`: `h = residual + rms(a) * post`; with `then_norm` also the next norm of
/// the sum, `n = rms(h) * next`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn norm_residual<X: Float, O: Float>(
    a: &Array<X>,
    residual: &Array<f32>,
    post: &Array<f32>,
    next: &Array<f32>,
    h: &mut Array<f32>,
    n: &mut Array<O>,
    d: u32,
    post_eps: f32,
    next_eps: f32,
    #[comptime] then_norm: bool,
) {
    let row = CUBE_POS_X as usize;
    let unit = UNIT_POS_X as usize;
    let width = d as usize;
    let base = row * width;
    let mut partial = SharedMemory::<f32>::new(NORM_UNITS);
    let inv = inverse_rms(a, base, width, post_eps, &mut partial, unit);
    let mut sum_h = 0.0;
    let mut i = unit;
    while i < width {
        let v = residual[base + i] + f32::cast_from(a[base + i]) * inv * post[i];
        h[base + i] = v;
        sum_h += v * v;
        i += NORM_UNITS;
    }
    if comptime!(then_norm) {
        // Every unit has read the first sum before the second overwrites it.
        sync_cube();
        let total_h = cube_sum(&mut partial, unit, sum_h, NORM_UNITS);
        let inv_h = 1.0 / f32::sqrt(total_h / f32::cast_from(width) + next_eps);
        let mut i = unit;
        while i < width {
            n[base + i] = O::cast_from(h[base + i] * inv_h * next[i]);
            i += NORM_UNITS;
        }
    }
}
