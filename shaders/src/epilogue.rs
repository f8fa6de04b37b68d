//! What a product kernel does with its results before they leave it: one function shared
//! by the matrix-vector kernel, the tiled kernel and a stand-alone kernel (for products
//! computed elsewhere), so that a layer's element-wise work costs no dispatch of its own.
//!
//! An epilogue takes the product's values two adjacent rows at a time (`row` even, `row +
//! 1`), which is what RoPE (rotated pairs are adjacent dimensions) and SwiGLU (gate and up
//! rows interleaved at load) need. Every epilogue binds the same arrays, `aux_a`, `aux_b`,
//! `info` and `table` and three sizes (`q_width`, `kv_width`, `head_dim`); a mode that does
//! not use one gets a one-element placeholder.
//!
//! Values arrive as FP32 sums and are written as `out`'s float type `O` (FP32, FP16 or
//! BF16). `aux_a`, `aux_b` (the residual stream, the KV arenas) and `table` are FP32.

use cubecl::prelude::*;

/// `out[t, r] = v`: the product as it is.
pub const STORE: u32 = 0;
/// `out[t, r] = v + aux_a[t, r]`: the residual add after the O and down projections.
pub const RESIDUAL: u32 = 1;
/// `out[t, j] = silu(v[t, 2j]) * v[t, 2j + 1]`: SwiGLU over gate and up rows interleaved.
pub const SWIGLU: u32 = 2;
/// Q, K and V rows side by side (`[q | k | v]`): RoPE on Q and K at position
/// `info[2 t]`, Q to `out[t, ..]`, K and V written into the FP32 KV arenas `aux_a` and
/// `aux_b` at row `info[2 t + 1]`. `table[pos * head_dim + 2 i]` holds cos and the next
/// value sin of angle `i` at `pos`.
pub const ROPE_KV: u32 = 3;
/// `out[t, j] = gelu(v[t, 2j]) * v[t, 2j + 1]`: GeGLU (GELU in its tanh form) over gate
/// and up rows interleaved.
pub const GEGLU: u32 = 4;

/// Width of the output row for a product of `rows` rows under `mode`.
pub const fn out_width(mode: u32, rows: usize, q_width: usize) -> usize {
    match mode {
        SWIGLU | GEGLU => rows / 2,
        ROPE_KV => q_width,
        _ => rows,
    }
}

/// Finishes rows `row` and `row + 1` (`row` even; `row + 1` may be past `rows` for plain
/// and residual outputs of odd height) of token `t`, whose products are `a` and `b`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn finish_pair<O: Float>(
    out: &mut Array<O>,
    aux_a: &mut Array<f32>,
    aux_b: &mut Array<f32>,
    info: &Array<u32>,
    table: &Array<f32>,
    t: usize,
    row: usize,
    rows: usize,
    a: f32,
    b: f32,
    q_width: u32,
    kv_width: u32,
    head_dim: u32,
    #[comptime] mode: u32,
) {
    let second = row + 1 < rows;
    if comptime!(mode == STORE) {
        out[t * rows + row] = O::cast_from(a);
        if second {
            out[t * rows + row + 1] = O::cast_from(b);
        }
    } else if comptime!(mode == RESIDUAL) {
        let at = t * rows + row;
        out[at] = O::cast_from(a + aux_a[at]);
        if second {
            out[at + 1] = O::cast_from(b + aux_a[at + 1]);
        }
    } else if comptime!(mode == SWIGLU) {
        out[t * (rows / 2) + row / 2] = O::cast_from(a / (1.0 + f32::exp(-a)) * b);
    } else if comptime!(mode == GEGLU) {
        out[t * (rows / 2) + row / 2] = O::cast_from(gelu_tanh(a) * b);
    } else {
        let q_width = q_width as usize;
        let kv_width = kv_width as usize;
        let head_dim = head_dim as usize;
        let pos = info[2 * t] as usize;
        let slot_row = info[2 * t + 1] as usize;
        if row < q_width + kv_width {
            let angle = pos * head_dim + row % head_dim;
            let c = table[angle];
            let s = table[angle + 1];
            let ra = a * c - b * s;
            let rb = a * s + b * c;
            if row < q_width {
                out[t * q_width + row] = O::cast_from(ra);
                out[t * q_width + row + 1] = O::cast_from(rb);
            } else {
                let at = slot_row * kv_width + row - q_width;
                aux_a[at] = ra;
                aux_a[at + 1] = rb;
            }
        } else {
            let at = slot_row * kv_width + row - q_width - kv_width;
            aux_b[at] = a;
            aux_b[at + 1] = b;
        }
    }
}

/// The epilogue over a product computed elsewhere: `product` `[n_tokens, rows]`.
/// A unit per (token, row pair).
#[cube(launch)]
// CubeCL expands operators, not `div_ceil`.
#[allow(clippy::too_many_arguments, clippy::manual_div_ceil)]
pub fn finish_product<P: Float, O: Float>(
    product: &Array<P>,
    out: &mut Array<O>,
    aux_a: &mut Array<f32>,
    aux_b: &mut Array<f32>,
    info: &Array<u32>,
    table: &Array<f32>,
    rows: u32,
    n_tokens: u32,
    q_width: u32,
    kv_width: u32,
    head_dim: u32,
    #[comptime] mode: u32,
) {
    let rows = rows as usize;
    let pairs = (rows + 1) / 2;
    let i = ABSOLUTE_POS;
    if i < pairs * n_tokens as usize {
        let t = i / pairs;
        let row = 2 * (i % pairs);
        let a = f32::cast_from(product[t * rows + row]);
        let mut b = f32::new(0.0);
        if row + 1 < rows {
            b = f32::cast_from(product[t * rows + row + 1]);
        }
        finish_pair(
            out, aux_a, aux_b, info, table, t, row, rows, a, b, q_width, kv_width, head_dim, mode,
        );
    }
}

/// GELU in its tanh form, `0.5 g (1 + tanh(u))` with `u = sqrt(2 / pi) (g + 0.044715 g^3)`,
/// written as `g / (1 + exp(-2 u))`, which is the same and has no overflow to NaN.
#[cube]
pub fn gelu_tanh(g: f32) -> f32 {
    let u = 0.797_884_6 * (g + 0.044_715 * g * g * g);
    g / (1.0 + f32::exp(-2.0 * u))
}
