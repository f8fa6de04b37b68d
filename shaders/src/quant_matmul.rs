//! Matrix products with GGUF block-quantized weights, dequantized in registers and
//! accumulated in FP32, written once in CubeCL. Inputs have the float type `X` and outputs
//! `O` (each FP32, FP16 or BF16); products and sums are FP32.
//!
//! A weight matrix has `rows` (outputs) of `cols` (inputs, a multiple of 32) values, stored
//! as GGUF stores it: row after row, each row a run of blocks of 32 values. A block lives
//! in two arrays, so the device copy is as small as the file:
//! - `quants`: the block's codes, 4 words for Q4_0 / Q4_1 (value `j < 16` in the low nibble
//!   of byte `j`, value `j + 16` in its high nibble, byte `j` in bits `8 (j % 4)..` of word
//!   `j / 4`), 8 words for Q8_0 (value `j` in byte `j`, two's complement).
//! - `scales`: IEEE halves. Q4_1 has a word per block (`d` low, `m` high); Q4_0 and Q8_0
//!   have one half `d` per block, two blocks per word (the even block low).
//!
//! The K-quants come as groups of 32 (the host's `PackedMatrix`): K4 (Q4_K) with Q4's codes,
//! K8 (Q6_K, Q3_K) with Q8_0's; both have two FP32 words per block: K4 `d` and `m`, K8 a
//! `d` for each half of 16 values. K5 (Q5_0, Q5_1, Q5_K) has Q4's words for the low four
//! bits and three scale words per block: FP32 `d`, FP32 `m` and the fifth bits (bit `j`
//! for value `j`), so the code words stay four per block, whole vectors. K2 (Q2_K) has
//! Q4's words (codes 0..3) and four FP32 scale words per block: `d` and `m` of each half.
//!
//! Every format decodes as `d * q + m`: Q4_1 and K4 store `m`, Q4_0 has `m = -8 d` (codes
//! 0..15 centred on 8), Q8_0 has `m = 0` with signed codes. A product over a block is thus
//! `d * sum(q x) + m * sum(x)`, one multiply per value; K8's is `d_0 * sum_0(q x) + d_1 *
//! sum_1(q x)` over its halves, K2's that plus `m_0 * sum_0(x) + m_1 * sum_1(x)`.
//!
//! Kernels: [`quant_matvec()`] for a few tokens (decode), [`quant_matmul()`] tiled through
//! workgroup memory for many (prefill), [`quant_rows()`] to gather rows (embedding lookup).

use cubecl::prelude::*;

use crate::epilogue::finish_pair;
use crate::paged_attention::half_to_f32;

/// Values per quantization block.
pub const QBLOCK: usize = 32;
/// Format code of Q4_0.
pub const Q4_0: u32 = 0;
/// Format code of Q4_1.
pub const Q4_1: u32 = 1;
/// Format code of Q8_0.
pub const Q8_0: u32 = 2;
/// Format code of K4: a Q4_K group of 32, Q4's codes with FP32 `d` and `m`.
pub const K4: u32 = 3;
/// Format code of K8: a Q6_K or Q3_K group of 32, signed bytes with an FP32 `d` per half.
pub const K8: u32 = 4;
/// Format code of K5: a Q5_0 or Q5_1 block or a Q5_K group of 32, 5-bit codes (Q4's
/// nibbles, the fifth bits in the scale words) with FP32 `d` and `m`.
pub const K5: u32 = 5;

/// Scale words per block of K5: `d`, `m`, the fifth bits.
pub const K5_SCALE_WORDS: usize = 3;
/// Format code of K2: a Q2_K group of 32, Q4's codes (0..3) with an FP32 `d` and `m` for
/// each half of 16 values.
pub const K2: u32 = 6;
/// Scale words per block of K2: `d_0`, `d_1`, `m_0`, `m_1`.
pub const K2_SCALE_WORDS: usize = 4;

/// Whether the codes are signed bytes (Q8_0, K8) rather than nibbles.
pub const fn byte_codes(format: u32) -> bool {
    format == Q8_0 || format == K8
}

/// Whether a block's product has the offset term `m * sum(x)`.
pub const fn has_offset(format: u32) -> bool {
    !byte_codes(format)
}

/// Whether each half of a block has its own scale (K8, K2), summed apart.
pub const fn half_scales(format: u32) -> bool {
    format == K8 || format == K2
}

/// Whether value `c` of a block takes the second half's scale (K8, K2).
pub const fn second_half(format: u32, c: usize) -> bool {
    half_scales(format) && c >= QBLOCK / 2
}

/// Most tokens one [`quant_matvec()`] launch handles; larger batches use [`quant_matmul()`].
pub const MATVEC_MAX_TOKENS: usize = 8;
/// Tokens per tile of [`quant_matmul()`].
pub const TILE_TOKENS: usize = 32;
/// Output rows per tile of [`quant_matmul()`].
pub const TILE_ROWS: usize = 64;
/// Units per side of a [`quant_matmul()`] cube (8 x 8, one per row of the tile).
pub const TILE_UNITS: usize = 8;

/// `u32` words of codes per block.
pub const fn quant_words(format: u32) -> usize {
    if byte_codes(format) {
        8
    } else {
        4
    }
}

/// Codes per word: four bytes (Q8_0) or eight nibbles (Q4_x).
pub const fn codes_per_word(format: u32) -> usize {
    if byte_codes(format) {
        4
    } else {
        8
    }
}

/// Bit position of code `p` within its word.
pub const fn code_shift(format: u32, p: usize) -> u32 {
    if byte_codes(format) {
        8 * p as u32
    } else {
        (8 * (p % 4) + 4 * (p / 4)) as u32
    }
}

/// Index in the block (0..32) of code `p` of word `w`.
pub const fn code_value(format: u32, w: usize, p: usize) -> usize {
    if byte_codes(format) {
        4 * w + p
    } else {
        4 * w + p % 4 + 16 * (p / 4)
    }
}

/// The word (0..8) holding value `c` (0..32) of a block: the inverse of [`code_value`].
pub const fn value_word(format: u32, c: usize) -> usize {
    if byte_codes(format) {
        c / 4
    } else {
        (c % 16) / 4
    }
}

/// The bit position of value `c` within its word ([`value_word`]).
pub const fn value_shift(format: u32, c: usize) -> u32 {
    if byte_codes(format) {
        (8 * (c % 4)) as u32
    } else {
        (8 * (c % 4) + 4 * (c / 16)) as u32
    }
}

/// Values a vector load brings: input values and code words are read four at a time.
pub const VECTOR: usize = 4;

/// The scale `d` of `block` (K8, K2: of its first half).
#[cube]
fn block_d(scales: &Array<u32>, block: usize, #[comptime] format: u32) -> f32 {
    if comptime!(format == K2) {
        f32::reinterpret(scales[K2_SCALE_WORDS * block])
    } else if comptime!(format == K5) {
        f32::reinterpret(scales[K5_SCALE_WORDS * block])
    } else if comptime!(format == K4 || format == K8) {
        f32::reinterpret(scales[2 * block])
    } else if comptime!(format == Q4_1) {
        half_to_f32(scales[block] & 65535)
    } else {
        let word = scales[block / 2];
        half_to_f32((word >> (16 * (block as u32 % 2))) & 65535)
    }
}

/// The offset `m` of `block` given its scale `d` (K8, K2: the second half's scale).
#[cube]
fn block_m(scales: &Array<u32>, block: usize, d: f32, #[comptime] format: u32) -> f32 {
    if comptime!(format == K2) {
        f32::reinterpret(scales[K2_SCALE_WORDS * block + 1])
    } else if comptime!(format == K5) {
        f32::reinterpret(scales[K5_SCALE_WORDS * block + 1])
    } else if comptime!(format == K4 || format == K8) {
        f32::reinterpret(scales[2 * block + 1])
    } else if comptime!(format == Q4_1) {
        half_to_f32(scales[block] >> 16)
    } else if comptime!(format == Q4_0) {
        d * -8.0
    } else {
        f32::new(0.0)
    }
}

/// K2's offset of the first or (`second`) the second half of `block` (0 for the other
/// formats).
#[cube]
fn block_min(
    scales: &Array<u32>,
    block: usize,
    #[comptime] second: bool,
    #[comptime] format: u32,
) -> f32 {
    if comptime!(format == K2) {
        let at = comptime!(if second { 3usize } else { 2usize });
        f32::reinterpret(scales[K2_SCALE_WORDS * block + at])
    } else {
        f32::new(0.0)
    }
}

/// The fifth bits of `block` (K5; 0 for the other formats).
#[cube]
fn block_high(scales: &Array<u32>, block: usize, #[comptime] format: u32) -> u32 {
    if comptime!(format == K5) {
        scales[K5_SCALE_WORDS * block + 2]
    } else {
        u32::new(0)
    }
}

/// The code of value `c` at bit `shift` of `word`: a signed byte (Q8_0, K8) or an
/// unsigned nibble, K5's with its fifth bit from `high`.
#[cube]
fn code(
    word: u32,
    high: u32,
    #[comptime] shift: u32,
    #[comptime] c: usize,
    #[comptime] format: u32,
) -> f32 {
    if comptime!(byte_codes(format)) {
        let byte = (word >> shift) & 255;
        f32::cast_from(byte) - 256.0 * f32::cast_from(byte >> 7)
    } else if comptime!(format == K5) {
        let low = (word >> shift) & 15;
        f32::cast_from(low | (((high >> comptime!(c as u32)) & 1) << 4))
    } else {
        f32::cast_from((word >> shift) & 15)
    }
}

/// Value `c` of a block from its code: `d * q + m` (K8: `d * q` or, in the second half,
/// `m * q`; K2: `d * q + mins.0` or, in the second half, `m * q + mins.1`).
#[cube]
fn dequantized(
    q: f32,
    d: f32,
    m: f32,
    min_0: f32,
    min_1: f32,
    #[comptime] c: usize,
    #[comptime] format: u32,
) -> f32 {
    if comptime!(format == K2) {
        if comptime!(second_half(format, c)) {
            m * q + min_1
        } else {
            d * q + min_0
        }
    } else if comptime!(format == K8) {
        if comptime!(second_half(format, c)) {
            m * q
        } else {
            d * q
        }
    } else {
        d * q + m
    }
}

/// `out[t, r] = sum_c x[t, c] * W[r, c]` for up to `tokens` tokens (the compile-time bound;
/// `n_tokens` at run time).
///
/// Cube `(lanes, rows_per_cube / rows_per_unit)`: each unit adds up `rows_per_unit`
/// neighbouring rows, the `lanes` units of those rows split their blocks, each keeps one
/// FP32 sum per row and token, and the sums meet through plane operations when `planes`
/// (the lanes are one plane: lavapipe), else in workgroup memory (the shapes measured on
/// each device are in [`crate::quant_launch::MatvecShape`]).
///
/// Inputs and code words are read [`VECTOR`] at a time (launched with that vector size;
/// rows are whole blocks, so every vector is aligned): one 16-byte load on a GPU, and on
/// lavapipe, where each load is a loop over the SIMD lanes, a quarter of the loops. A unit
/// with several rows reads each input once for all of them.
#[cube(launch)]
// CubeCL expands operators, not `is_multiple_of`.
#[allow(clippy::too_many_arguments, clippy::manual_is_multiple_of)]
pub fn quant_matvec<X: Float, O: Float, N: Size>(
    x: &Array<Vector<X, N>>,
    quants: &Array<Vector<u32, N>>,
    scales: &Array<u32>,
    out: &mut Array<O>,
    aux_a: &mut Array<f32>,
    aux_b: &mut Array<f32>,
    info: &Array<u32>,
    table: &Array<f32>,
    rows: u32,
    cols: u32,
    n_tokens: u32,
    q_width: u32,
    kv_width: u32,
    head_dim: u32,
    #[comptime] format: u32,
    #[comptime] tokens: usize,
    #[comptime] lanes: usize,
    #[comptime] rows_per_cube: usize,
    #[comptime] rows_per_unit: usize,
    #[comptime] planes: bool,
    #[comptime] mode: u32,
) {
    let lane = UNIT_POS_X as usize;
    let first = UNIT_POS_Y as usize * rows_per_unit;
    let row0 = CUBE_POS_X as usize * rows_per_cube + first;
    let rows = rows as usize;
    let cols = cols as usize;
    let n_tokens = n_tokens as usize;
    let blocks = cols / QBLOCK;
    let words = comptime!(quant_words(format));
    let word_vectors = comptime!(quant_words(format) / VECTOR);
    let groups = comptime!(QBLOCK / VECTOR);
    let sums = comptime!(tokens * rows_per_unit);
    // Tokens past `n_tokens` read the last token again, rows past `rows` the last row;
    // their sums are never written. Offsets count vectors of `VECTOR` values.
    let mut x_row = Array::<usize>::new(tokens);
    #[unroll]
    for t in 0..tokens {
        x_row[t] = select(t < n_tokens, t, n_tokens - 1) * (cols / VECTOR);
    }
    let mut w_row = Array::<usize>::new(rows_per_unit);
    #[unroll]
    for r in 0..rows_per_unit {
        w_row[r] = select(row0 + r < rows, row0 + r, rows - 1) * blocks;
    }

    let mut acc = Array::<f32>::new(sums);
    #[unroll]
    for i in 0..sums {
        acc[i] = 0.0;
    }
    if row0 < rows {
        let mut b = lane;
        while b < blocks {
            let mut d = Array::<f32>::new(rows_per_unit);
            let mut m = Array::<f32>::new(rows_per_unit);
            let mut min_0 = Array::<f32>::new(rows_per_unit);
            let mut min_1 = Array::<f32>::new(rows_per_unit);
            let mut high = Array::<u32>::new(rows_per_unit);
            let mut code_words = Array::<u32>::new(comptime!(words * rows_per_unit));
            #[unroll]
            for r in 0..rows_per_unit {
                let block = w_row[r] + b;
                d[r] = block_d(scales, block, format);
                m[r] = block_m(scales, block, d[r], format);
                min_0[r] = block_min(scales, block, false, format);
                min_1[r] = block_min(scales, block, true, format);
                high[r] = block_high(scales, block, format);
                #[unroll]
                for v in 0..word_vectors {
                    let wv = quants[block * word_vectors + v];
                    #[unroll]
                    for k in 0..VECTOR {
                        code_words[comptime!(r * words + v * VECTOR + k)] = wv[k];
                    }
                }
            }
            // K8's and K2's second half goes to `dot_1` (K2's inputs to `sum_1`).
            let mut dot = Array::<f32>::new(sums);
            let mut dot_1 = Array::<f32>::new(sums);
            let mut sum = Array::<f32>::new(tokens);
            let mut sum_1 = Array::<f32>::new(tokens);
            #[unroll]
            for i in 0..sums {
                dot[i] = 0.0;
                dot_1[i] = 0.0;
            }
            #[unroll]
            for t in 0..tokens {
                sum[t] = 0.0;
                sum_1[t] = 0.0;
            }
            #[unroll]
            for g in 0..groups {
                #[unroll]
                for t in 0..tokens {
                    let xv = Vector::<f32, N>::cast_from(x[x_row[t] + b * groups + g]);
                    #[unroll]
                    for k in 0..VECTOR {
                        let c = comptime!(g * VECTOR + k);
                        #[unroll]
                        for r in 0..rows_per_unit {
                            let q = code(
                                code_words[comptime!(r * words + value_word(format, c))],
                                high[r],
                                comptime!(value_shift(format, c)),
                                c,
                                format,
                            );
                            if comptime!(second_half(format, c)) {
                                dot_1[t * rows_per_unit + r] += q * xv[k];
                            } else {
                                dot[t * rows_per_unit + r] += q * xv[k];
                            }
                        }
                        if comptime!(format == K2 && second_half(format, c)) {
                            sum_1[t] += xv[k];
                        } else if comptime!(has_offset(format)) {
                            sum[t] += xv[k];
                        }
                    }
                }
            }
            #[unroll]
            for t in 0..tokens {
                #[unroll]
                for r in 0..rows_per_unit {
                    let i = t * rows_per_unit + r;
                    acc[i] += d[r] * dot[i];
                    if comptime!(half_scales(format)) {
                        acc[i] += m[r] * dot_1[i];
                    }
                    if comptime!(format == K2) {
                        acc[i] += min_0[r] * sum[t] + min_1[r] * sum_1[t];
                    } else if comptime!(has_offset(format)) {
                        acc[i] += m[r] * sum[t];
                    }
                }
            }
            b += lanes;
        }
    }

    if comptime!(planes) {
        // The `lanes` units of a row group are one plane: their sums meet in registers,
        // and the unit of lane 0 finishes the pairs of rows it holds, with no workgroup
        // memory and no barrier.
        let mut totals = Array::<f32>::new(sums);
        #[unroll]
        for i in 0..sums {
            totals[i] = plane_sum(acc[i]);
        }
        if lane == 0 {
            #[unroll]
            for p in 0..comptime!(rows_per_unit / 2) {
                let r = comptime!(2 * p);
                let row = row0 + r;
                if row < rows {
                    #[unroll]
                    for t in 0..tokens {
                        if t < n_tokens {
                            finish_pair(
                                out,
                                aux_a,
                                aux_b,
                                info,
                                table,
                                t,
                                row,
                                rows,
                                totals[comptime!(t * rows_per_unit + r)],
                                totals[comptime!(t * rows_per_unit + r + 1)],
                                q_width,
                                kv_width,
                                head_dim,
                                mode,
                            );
                        }
                    }
                }
            }
        }
    } else {
        matvec_totals_in_shared(
            &acc,
            out,
            aux_a,
            aux_b,
            info,
            table,
            lane,
            first,
            row0,
            rows,
            n_tokens,
            q_width,
            kv_width,
            head_dim,
            tokens,
            lanes,
            rows_per_cube,
            rows_per_unit,
            mode,
        );
    }
}

/// [`quant_matvec()`]'s end without planes: each row's sums meet in workgroup memory, then
/// the units finish even rows with their neighbours (`rows_per_cube` is even, so pairs
/// never straddle cubes).
#[cube]
// CubeCL expands operators, not `is_multiple_of`.
#[allow(clippy::too_many_arguments, clippy::manual_is_multiple_of)]
fn matvec_totals_in_shared<O: Float>(
    acc: &Array<f32>,
    out: &mut Array<O>,
    aux_a: &mut Array<f32>,
    aux_b: &mut Array<f32>,
    info: &Array<u32>,
    table: &Array<f32>,
    lane: usize,
    first: usize,
    row0: usize,
    rows: usize,
    n_tokens: usize,
    q_width: u32,
    kv_width: u32,
    head_dim: u32,
    #[comptime] tokens: usize,
    #[comptime] lanes: usize,
    #[comptime] rows_per_cube: usize,
    #[comptime] rows_per_unit: usize,
    #[comptime] mode: u32,
) {
    let mut totals = SharedMemory::<f32>::new(tokens * rows_per_cube);
    if comptime!(lanes == 1) {
        #[unroll]
        for t in 0..tokens {
            #[unroll]
            for r in 0..rows_per_unit {
                totals[t * rows_per_cube + first + r] = acc[t * rows_per_unit + r];
            }
        }
    } else {
        let mut partial = SharedMemory::<f32>::new(tokens * lanes * rows_per_cube);
        #[unroll]
        for t in 0..tokens {
            #[unroll]
            for r in 0..rows_per_unit {
                partial[(t * rows_per_cube + first + r) * lanes + lane] =
                    acc[t * rows_per_unit + r];
            }
        }
        sync_cube();
        if lane == 0 {
            #[unroll]
            for t in 0..tokens {
                #[unroll]
                for r in 0..rows_per_unit {
                    let at = t * rows_per_cube + first + r;
                    let mut total = f32::new(0.0);
                    #[unroll]
                    for l in 0..lanes {
                        total += partial[at * lanes + l];
                    }
                    totals[at] = total;
                }
            }
        }
    }
    sync_cube();
    if lane == 0 {
        #[unroll]
        for r in 0..rows_per_unit {
            let local = first + r;
            let row = row0 + r;
            if local % 2 == 0 && row < rows {
                #[unroll]
                for t in 0..tokens {
                    if t < n_tokens {
                        finish_pair(
                            out,
                            aux_a,
                            aux_b,
                            info,
                            table,
                            t,
                            row,
                            rows,
                            totals[t * rows_per_cube + local],
                            totals[t * rows_per_cube + local + 1],
                            q_width,
                            kv_width,
                            head_dim,
                            mode,
                        );
                    }
                }
            }
        }
    }
}

/// `out[t, r] = sum_c x[t, c] * W[r, c]` for any number of tokens, tiled.
///
/// Cube `(8, 8)` per tile of 32 tokens x 64 rows. For each block column the cube stages the
/// tile's 32 x 32 inputs and its 64 rows' blocks, dequantized (unit `u` decodes row `u`'s
/// block), in workgroup memory as `X` (12 KiB in FP32, inside WebGPU's 16 KiB; 6 KiB in
/// FP16, plus 8 KiB for the sums with `own_sums`); unit `(ux, uy)` then adds up tokens
/// `uy + 8 a` for rows `ux + 8 r`, 32 FP32 sums in registers. Every weight is decoded
/// once per tile. The weights are staged column-major so that neighbouring units read
/// neighbouring words.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn quant_matmul<X: Float, O: Float>(
    x: &Array<X>,
    quants: &Array<u32>,
    scales: &Array<u32>,
    out: &mut Array<O>,
    aux_a: &mut Array<f32>,
    aux_b: &mut Array<f32>,
    info: &Array<u32>,
    table: &Array<f32>,
    rows: u32,
    cols: u32,
    n_tokens: u32,
    q_width: u32,
    kv_width: u32,
    head_dim: u32,
    #[comptime] format: u32,
    #[comptime] mode: u32,
    #[comptime] own_sums: bool,
) {
    let ux = UNIT_POS_X as usize;
    let uy = UNIT_POS_Y as usize;
    let unit = uy * TILE_UNITS + ux;
    let row0 = CUBE_POS_X as usize * TILE_ROWS;
    let tok0 = CUBE_POS_Y as usize * TILE_TOKENS;
    let rows = rows as usize;
    let cols = cols as usize;
    let n_tokens = n_tokens as usize;
    let blocks = cols / QBLOCK;
    let words = comptime!(quant_words(format));
    let per_word = comptime!(codes_per_word(format));
    let units = comptime!(TILE_UNITS * TILE_UNITS);
    let tok_per_unit = comptime!(TILE_TOKENS / TILE_UNITS);
    let rows_per_unit = comptime!(TILE_ROWS / TILE_UNITS);

    let mut xs = SharedMemory::<X>::new(TILE_TOKENS * QBLOCK);
    let mut ws = SharedMemory::<X>::new(QBLOCK * TILE_ROWS);
    let mut acc = Array::<f32>::new(tok_per_unit * rows_per_unit);
    #[unroll]
    for i in 0..tok_per_unit * rows_per_unit {
        acc[i] = 0.0;
    }

    let w_row = row0 + unit;
    let in_range = w_row < rows;
    for b in 0..blocks {
        #[unroll]
        for i in 0..comptime!(TILE_TOKENS * QBLOCK / (TILE_UNITS * TILE_UNITS)) {
            let idx = unit + i * units;
            let t = tok0 + idx / QBLOCK;
            let mut v = X::new(0.0);
            if t < n_tokens {
                v = x[t * cols + b * QBLOCK + idx % QBLOCK];
            }
            xs[idx] = v;
        }
        let block = w_row * blocks + b;
        let mut d = f32::new(0.0);
        let mut m = f32::new(0.0);
        let mut min_0 = f32::new(0.0);
        let mut min_1 = f32::new(0.0);
        let mut high = 0u32;
        if in_range {
            d = block_d(scales, block, format);
            m = block_m(scales, block, d, format);
            min_0 = block_min(scales, block, false, format);
            min_1 = block_min(scales, block, true, format);
            high = block_high(scales, block, format);
        }
        #[unroll]
        for w in 0..words {
            let mut word = 0u32;
            if in_range {
                word = quants[block * words + w];
            }
            #[unroll]
            for p in 0..per_word {
                let c = comptime!(code_value(format, w, p));
                let q = code(word, high, comptime!(code_shift(format, p)), c, format);
                ws[c * TILE_ROWS + unit] =
                    X::cast_from(dequantized(q, d, m, min_0, min_1, c, format));
            }
        }
        sync_cube();
        #[unroll]
        for k in 0..QBLOCK {
            let mut wv = Array::<f32>::new(rows_per_unit);
            #[unroll]
            for r in 0..rows_per_unit {
                wv[r] = f32::cast_from(ws[k * TILE_ROWS + ux + r * TILE_UNITS]);
            }
            #[unroll]
            for a in 0..tok_per_unit {
                let xv = f32::cast_from(xs[(uy + a * TILE_UNITS) * QBLOCK + k]);
                #[unroll]
                for r in 0..rows_per_unit {
                    acc[a * rows_per_unit + r] += xv * wv[r];
                }
            }
        }
        sync_cube();
    }

    // The tile's sums go through workgroup memory so that each unit finishes pairs of
    // adjacent rows: through the weights' stage (exactly one tile) when it is FP32, else
    // through FP32 memory of their own, so they are not rounded to `X`.
    if comptime!(own_sums) {
        let mut sums = SharedMemory::<f32>::new(TILE_TOKENS * TILE_ROWS);
        finish_tile(
            &mut sums, &acc, out, aux_a, aux_b, info, table, ux, uy, row0, tok0, rows, n_tokens,
            q_width, kv_width, head_dim, mode,
        );
    } else {
        finish_tile(
            &mut ws, &acc, out, aux_a, aux_b, info, table, ux, uy, row0, tok0, rows, n_tokens,
            q_width, kv_width, head_dim, mode,
        );
    }
}

/// [`quant_matmul()`]'s end: the unit's sums `acc` into `stage` (one tile), then the
/// epilogue over pairs of adjacent rows.
#[cube]
#[allow(clippy::too_many_arguments)]
fn finish_tile<S: Float, O: Float>(
    stage: &mut SharedMemory<S>,
    acc: &Array<f32>,
    out: &mut Array<O>,
    aux_a: &mut Array<f32>,
    aux_b: &mut Array<f32>,
    info: &Array<u32>,
    table: &Array<f32>,
    ux: usize,
    uy: usize,
    row0: usize,
    tok0: usize,
    rows: usize,
    n_tokens: usize,
    q_width: u32,
    kv_width: u32,
    head_dim: u32,
    #[comptime] mode: u32,
) {
    let unit = uy * TILE_UNITS + ux;
    let units = comptime!(TILE_UNITS * TILE_UNITS);
    let tok_per_unit = comptime!(TILE_TOKENS / TILE_UNITS);
    let rows_per_unit = comptime!(TILE_ROWS / TILE_UNITS);
    #[unroll]
    for a in 0..tok_per_unit {
        #[unroll]
        for r in 0..rows_per_unit {
            stage[(uy + a * TILE_UNITS) * TILE_ROWS + ux + r * TILE_UNITS] =
                S::cast_from(acc[a * rows_per_unit + r]);
        }
    }
    sync_cube();
    let pairs = comptime!(TILE_TOKENS * TILE_ROWS / 2);
    #[unroll]
    for i in 0..comptime!(pairs / (TILE_UNITS * TILE_UNITS)) {
        let idx = unit + i * units;
        let local_t = idx / comptime!(TILE_ROWS / 2);
        let local_row = 2 * (idx % comptime!(TILE_ROWS / 2));
        let t = tok0 + local_t;
        let row = row0 + local_row;
        if t < n_tokens && row < rows {
            finish_pair(
                out,
                aux_a,
                aux_b,
                info,
                table,
                t,
                row,
                rows,
                f32::cast_from(stage[local_t * TILE_ROWS + local_row]),
                f32::cast_from(stage[local_t * TILE_ROWS + local_row + 1]),
                q_width,
                kv_width,
                head_dim,
                mode,
            );
        }
    }
}

/// `out[t, c] = W[ids[t], c]`: rows gathered and dequantized (the embedding lookup).
///
/// Cube `(block columns / 32, token)`, 32 units, one block of the row each.
#[cube(launch)]
pub fn quant_rows<O: Float>(
    ids: &Array<u32>,
    quants: &Array<u32>,
    scales: &Array<u32>,
    out: &mut Array<O>,
    cols: u32,
    #[comptime] format: u32,
) {
    let b = CUBE_POS_X as usize * QBLOCK + UNIT_POS_X as usize;
    let t = CUBE_POS_Y as usize;
    let cols = cols as usize;
    let blocks = cols / QBLOCK;
    let words = comptime!(quant_words(format));
    let per_word = comptime!(codes_per_word(format));
    if b < blocks {
        let block = ids[t] as usize * blocks + b;
        let d = block_d(scales, block, format);
        let m = block_m(scales, block, d, format);
        let min_0 = block_min(scales, block, false, format);
        let min_1 = block_min(scales, block, true, format);
        let high = block_high(scales, block, format);
        #[unroll]
        for w in 0..words {
            let word = quants[block * words + w];
            #[unroll]
            for p in 0..per_word {
                let c = comptime!(code_value(format, w, p));
                let q = code(word, high, comptime!(code_shift(format, p)), c, format);
                out[t * cols + b * QBLOCK + c] =
                    O::cast_from(dequantized(q, d, m, min_0, min_1, c, format));
            }
        }
    }
}
