//! Attention over the paged KV cache, written once in CubeCL.
//!
//! Layout shared with `fornax_engine::kv`: each precision tier of a layer is an arena of
//! rows `slot * 32 + offset` (one row per token) and columns `kv_head * width + i`:
//! FP32 stores `head_dim` floats per head, FP16 stores `head_dim / 2` words per head (two
//! halves per `u32`, the even dimension in the low bits, as `unpack2x16float` reads them),
//! INT8 stores `head_dim / 4` words per head (dimension `4w + b` in byte `b`, two's
//! complement). FP16 and INT8 blocks carry one FP32 scale per (slot, kv head).
//!
//! A block-table entry is `tier << 28 | slot` (tier 0 FP32, 1 FP16, 2 INT8). Scores,
//! softmax and the sums are FP32 whatever the activations' float type `F` of the queries
//! and the output; the softmax is the online (running maximum) form so one pass over the
//! tiles suffices.
//!
//! Loops are nested: an outer loop that the shader runs and an inner one of a few steps
//! that is unrolled (`DIM_CHUNK` dimensions or `KEY_CHUNK` keys). Fully unrolled loops over
//! the head dimension and the 32 keys of a tile made shaders of thousands of operations,
//! which took lavapipe's LLVM many minutes to compile with an empty shader cache (over
//! 1,300 CPU-seconds for one kernel). Rolled loops must still stay short: llvmpipe
//! (lavapipe) silently stops a shader's loops after 65,535 iterations in all, per
//! invocation (measured: the prefill kernel went wrong past about 400 keys with one loop
//! step per key and dimension). Per 32-key tile the decode kernel runs
//! `2 hd / 16 + group (hd / 16 + 10) + 1` loop steps (51 at `hd` 64, `group` 3, so about
//! 40,000 keys fit) and the prefill kernel `2 hd / 16 + 17` (25: about 80,000 keys).
//!
//! Both kernels read K and V one tile (32 tokens x `head_dim`) at a time into workgroup
//! memory, K then V through the same buffer, so a cube needs only `32 * head_dim * 4`
//! bytes of it (8 KiB at `head_dim` 64), inside WebGPU's default 16 KiB.

use cubecl::prelude::*;

/// Tokens per KV block and per tile.
pub const BLOCK_TOKENS: usize = 32;
/// Bit position of the tier in a block-table entry.
pub const TIER_SHIFT: u32 = 28;
/// Mask of the slot in a block-table entry.
pub const SLOT_MASK: u32 = (1 << TIER_SHIFT) - 1;
/// A score low enough to vanish in `exp` without writing an infinity (WGSL has none).
const NEG_BIG: f32 = -1.0e30;
/// Head dimensions per step of the loops over a row (unrolled inside, rolled outside).
const DIM_CHUNK: usize = 16;
/// Keys per step of the loops over a tile's keys.
const KEY_CHUNK: usize = 4;
/// The kernels need `head_dim` to be a multiple of this (every Llama-family model's is);
/// other shapes take the burn reference path.
pub const HEAD_DIM_MULTIPLE: usize = DIM_CHUNK;

/// The K or V arenas of one layer, one per tier.
#[derive(CubeLaunch, CubeType)]
pub struct TierArenas {
    /// FP32 rows, `head_dim` floats per head.
    pub f32_rows: Array<f32>,
    /// FP16 rows, two halves per word.
    pub f16_rows: Array<u32>,
    /// One scale per (FP16 slot, head).
    pub f16_scales: Array<f32>,
    /// INT8 rows, four bytes per word.
    pub i8_rows: Array<u32>,
    /// One scale per (INT8 slot, head).
    pub i8_scales: Array<f32>,
}

/// Decodes an IEEE half stored in the low 16 bits of `h` (normals and subnormals exact).
#[cube]
pub fn half_to_f32(h: u32) -> f32 {
    let e = (h >> 10) & 31;
    let m = h & 1023;
    let mut mantissa = f32::cast_from(m);
    let mut exponent = e;
    if e == 0 {
        exponent = 1;
    } else {
        mantissa += 1024.0;
    }
    // 2^(exponent - 25) built from its bits: exponent - 25 + 127 is always a normal.
    let pow = f32::reinterpret((exponent + 102) << 23);
    let value = mantissa * pow;
    if (h >> 15) & 1 == 1 {
        -value
    } else {
        value
    }
}

/// Where a kernel reads K or V rows from: all tiers ([`TierArenas`]) or, for batches held
/// entirely in FP32, the FP32 arena alone ([`F32Rows`]), which binds 8 fewer buffers
/// per kernel. WebGPU allows 10 storage buffers per kernel in Chromium (8 guaranteed);
/// the tiered kernels bind 16.
#[cube]
pub trait KvRows {
    /// Loads token row `row` of kv head `head` from the arena of `tier` into
    /// `tile[dst..dst + hd]`, or zeros when `valid` is false (rows past the sequence may
    /// hold anything).
    #[allow(clippy::too_many_arguments)]
    fn load_row(
        &self,
        tier: u32,
        slot: usize,
        row: usize,
        head: usize,
        n_kv: usize,
        valid: bool,
        tile: &mut SharedMemory<f32>,
        dst: usize,
        #[comptime] hd: usize,
    );

    /// Reads token row `row` of kv head `head` from the arena of `tier` into `out[..hd]`,
    /// every loop unrolled so that `out` can live in registers.
    #[allow(clippy::too_many_arguments)]
    fn read_row(
        &self,
        tier: u32,
        slot: usize,
        row: usize,
        head: usize,
        n_kv: usize,
        out: &mut Array<f32>,
        #[comptime] hd: usize,
    );
}

#[cube]
impl KvRows for TierArenas {
    #[allow(clippy::too_many_arguments)]
    fn load_row(
        &self,
        tier: u32,
        slot: usize,
        row: usize,
        head: usize,
        n_kv: usize,
        valid: bool,
        tile: &mut SharedMemory<f32>,
        dst: usize,
        #[comptime] hd: usize,
    ) {
        if !valid {
            zero_row(tile, dst, hd);
        } else {
            decode_row::<SharedMemory<f32>>(
                self, tier, slot, row, head, n_kv, tile, dst, hd, false,
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn read_row(
        &self,
        tier: u32,
        slot: usize,
        row: usize,
        head: usize,
        n_kv: usize,
        out: &mut Array<f32>,
        #[comptime] hd: usize,
    ) {
        decode_row::<Array<f32>>(self, tier, slot, row, head, n_kv, out, 0, hd, true);
    }
}

/// Decodes token row `row` of kv head `head` from the arena of `tier` into
/// `out[dst..dst + hd]`: in rolled steps of `DIM_CHUNK` dimensions, or with every loop
/// unrolled when `unrolled` (so that a local `out` can live in registers).
#[cube]
#[allow(clippy::too_many_arguments)]
fn decode_row<L: ListMut<f32>>(
    arenas: &TierArenas,
    tier: u32,
    slot: usize,
    row: usize,
    head: usize,
    n_kv: usize,
    out: &mut L,
    dst: usize,
    #[comptime] hd: usize,
    #[comptime] unrolled: bool,
) {
    if tier == 0 {
        copy_row::<L>(
            &arenas.f32_rows,
            row * n_kv * hd + head * hd,
            out,
            dst,
            hd,
            unrolled,
        );
    } else if tier == 1 {
        unpack_row::<L>(
            &arenas.f16_rows,
            &arenas.f16_scales,
            slot,
            row,
            head,
            n_kv,
            out,
            dst,
            hd,
            2usize,
            unrolled,
        );
    } else {
        unpack_row::<L>(
            &arenas.i8_rows,
            &arenas.i8_scales,
            slot,
            row,
            head,
            n_kv,
            out,
            dst,
            hd,
            4usize,
            unrolled,
        );
    }
}

/// Decodes a row packed `per_word` values to a word (2: FP16 halves, 4: INT8 bytes), times
/// its block's scale, into `out[dst..dst + hd]`, with [`decode_row`]'s loop shapes.
#[cube]
#[allow(clippy::too_many_arguments)]
fn unpack_row<L: ListMut<f32>>(
    words: &Array<u32>,
    scales: &Array<f32>,
    slot: usize,
    row: usize,
    head: usize,
    n_kv: usize,
    out: &mut L,
    dst: usize,
    #[comptime] hd: usize,
    #[comptime] per_word: usize,
    #[comptime] unrolled: bool,
) {
    let chunk = comptime!(if unrolled { hd } else { DIM_CHUNK });
    let row_words = comptime!(hd / per_word);
    let per_chunk = comptime!(chunk / per_word);
    let base = row * n_kv * row_words + head * row_words;
    let scale = scales[slot * n_kv + head];
    #[unroll(unrolled)]
    for c in 0..comptime!(hd / chunk) {
        #[unroll]
        for i in 0..per_chunk {
            let w = c * per_chunk + i;
            let word = words[base + w];
            #[unroll]
            for b in 0..comptime!(per_word as u32) {
                let value = if comptime!(per_word == 2) {
                    half_to_f32((word >> (16 * b)) & 65535)
                } else {
                    signed_byte(word, b)
                };
                out.write(dst + per_word * w + b as usize, value * scale);
            }
        }
    }
}

/// Byte `b` of `word` as a two's-complement value.
#[cube]
fn signed_byte(word: u32, b: u32) -> f32 {
    let byte = (word >> (8 * b)) & 255;
    f32::cast_from(byte) - 256.0 * f32::cast_from(byte >> 7)
}

/// Writes `hd` zeros into `tile[dst..]`.
#[cube]
fn zero_row(tile: &mut SharedMemory<f32>, dst: usize, #[comptime] hd: usize) {
    for c in 0..comptime!(hd / DIM_CHUNK) {
        #[unroll]
        for i in 0..DIM_CHUNK {
            tile[dst + c * DIM_CHUNK + i] = 0.0;
        }
    }
}

/// Copies `hd` floats from `rows[base..]` into `out[dst..]`, in rolled steps of
/// `DIM_CHUNK` or, when `unrolled`, in one unrolled loop.
#[cube]
fn copy_row<L: ListMut<f32>>(
    rows: &Array<f32>,
    base: usize,
    out: &mut L,
    dst: usize,
    #[comptime] hd: usize,
    #[comptime] unrolled: bool,
) {
    let chunk = comptime!(if unrolled { hd } else { DIM_CHUNK });
    #[unroll(unrolled)]
    for c in 0..comptime!(hd / chunk) {
        #[unroll]
        for i in 0..chunk {
            let d = c * chunk + i;
            out.write(dst + d, rows[base + d]);
        }
    }
}

/// The FP32 arena of K or V alone.
#[derive(CubeLaunch, CubeType)]
pub struct F32Rows {
    /// FP32 rows, `head_dim` floats per head.
    pub rows: Array<f32>,
}

#[cube]
impl KvRows for F32Rows {
    #[allow(clippy::too_many_arguments)]
    fn load_row(
        &self,
        _tier: u32,
        _slot: usize,
        row: usize,
        head: usize,
        n_kv: usize,
        valid: bool,
        tile: &mut SharedMemory<f32>,
        dst: usize,
        #[comptime] hd: usize,
    ) {
        if !valid {
            zero_row(tile, dst, hd);
        } else {
            copy_row::<SharedMemory<f32>>(
                &self.rows,
                row * n_kv * hd + head * hd,
                tile,
                dst,
                hd,
                false,
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn read_row(
        &self,
        _tier: u32,
        _slot: usize,
        row: usize,
        head: usize,
        n_kv: usize,
        out: &mut Array<f32>,
        #[comptime] hd: usize,
    ) {
        copy_row::<Array<f32>>(&self.rows, row * n_kv * hd + head * hd, out, 0, hd, true);
    }
}

/// The first key a query sees when it sees keys `0..n_keys`, the last `window` of them
/// (`window` 0: all of them).
#[cube]
fn first_key(n_keys: usize, window: usize) -> usize {
    let mut first = 0usize;
    if window > 0 && n_keys > window {
        first = n_keys - window;
    }
    first
}

/// Decode attention: one query token per row, rows of many sequences in one dispatch.
///
/// Cube `(row, kv_head)`, 32 units. Unit `u` loads token `u` of each tile and scores it
/// against the `group` query heads of this kv head; each unit then owns dimensions
/// `u, u + 32, ..` of the output.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn paged_decode<F: Float, K: KvRows + LaunchArg>(
    q: &Array<F>,
    keys: &K,
    values: &K,
    tables: &Array<u32>,
    row_seq: &Array<u32>,
    row_pos: &Array<u32>,
    out: &mut Array<F>,
    max_blocks: u32,
    n_kv: u32,
    softmax_scale: f32,
    window: u32,
    #[comptime] hd: usize,
    #[comptime] group: usize,
) {
    let row = CUBE_POS_X as usize;
    let head = CUBE_POS_Y as usize;
    let unit = UNIT_POS_X as usize;
    let n_kv = n_kv as usize;
    let n_heads = n_kv * group;
    let seq = row_seq[row] as usize;
    let n_keys = row_pos[row] as usize + 1;
    let first = first_key(n_keys, window as usize);
    let per_unit = comptime!(hd.div_ceil(BLOCK_TOKENS));
    // Whether every unit owns exactly `per_unit` dimensions (no bounds check needed).
    let whole = comptime!(hd.is_multiple_of(BLOCK_TOKENS));

    let mut q_sh = SharedMemory::<f32>::new(group * hd);
    let mut tile = SharedMemory::<f32>::new(BLOCK_TOKENS * hd);
    let mut probs = SharedMemory::<f32>::new(group * BLOCK_TOKENS);

    let q_base = row * n_heads * hd + head * group * hd;
    let mut i = unit;
    while i < group * hd {
        q_sh[i] = f32::cast_from(q[q_base + i]) * softmax_scale;
        i += BLOCK_TOKENS;
    }

    let mut running_max = Array::<f32>::new(group);
    let mut running_sum = Array::<f32>::new(group);
    let mut acc = Array::<f32>::new(group * per_unit);
    for h in 0..group {
        running_max[h] = f32::new(NEG_BIG);
        running_sum[h] = 0.0;
        #[unroll]
        for j in 0..per_unit {
            acc[h * per_unit + j] = 0.0;
        }
    }
    sync_cube();

    let n_tiles = n_keys.div_ceil(BLOCK_TOKENS);
    for t in first / BLOCK_TOKENS..n_tiles {
        let entry = tables[seq * max_blocks as usize + t];
        let tier = entry >> TIER_SHIFT;
        let slot = (entry & SLOT_MASK) as usize;
        let token = t * BLOCK_TOKENS + unit;
        let valid = token >= first && token < n_keys;
        let arena_row = slot * BLOCK_TOKENS + unit;

        keys.load_row(
            tier,
            slot,
            arena_row,
            head,
            n_kv,
            valid,
            &mut tile,
            unit * hd,
            hd,
        );
        sync_cube();
        for h in 0..group {
            let mut score = 0.0;
            for c in 0..comptime!(hd / DIM_CHUNK) {
                #[unroll]
                for i in 0..DIM_CHUNK {
                    let d = c * DIM_CHUNK + i;
                    score += q_sh[h * hd + d] * tile[unit * hd + d];
                }
            }
            if !valid {
                score = f32::new(NEG_BIG);
            }
            probs[h * BLOCK_TOKENS + unit] = score;
        }
        sync_cube();
        values.load_row(
            tier,
            slot,
            arena_row,
            head,
            n_kv,
            valid,
            &mut tile,
            unit * hd,
            hd,
        );
        sync_cube();

        for h in 0..group {
            let mut tile_max = f32::new(NEG_BIG);
            #[unroll]
            for k in 0..BLOCK_TOKENS {
                tile_max = f32::max(tile_max, probs[h * BLOCK_TOKENS + k]);
            }
            let new_max = f32::max(running_max[h], tile_max);
            let correction = f32::exp(running_max[h] - new_max);
            let mut sum = running_sum[h] * correction;
            // This head's share of the output in registers while the keys go by.
            let mut acc_h = Array::<f32>::new(per_unit);
            #[unroll]
            for j in 0..per_unit {
                acc_h[j] = acc[h * per_unit + j] * correction;
            }
            for c in 0..comptime!(BLOCK_TOKENS / KEY_CHUNK) {
                #[unroll]
                for i in 0..KEY_CHUNK {
                    let k = c * KEY_CHUNK + i;
                    let p = f32::exp(probs[h * BLOCK_TOKENS + k] - new_max);
                    sum += p;
                    #[unroll]
                    for j in 0..per_unit {
                        let d = unit + j * BLOCK_TOKENS;
                        if whole || d < hd {
                            acc_h[j] += p * tile[k * hd + d];
                        }
                    }
                }
            }
            #[unroll]
            for j in 0..per_unit {
                acc[h * per_unit + j] = acc_h[j];
            }
            running_max[h] = new_max;
            running_sum[h] = sum;
        }
        sync_cube();
    }

    for h in 0..group {
        #[unroll]
        for j in 0..per_unit {
            let d = unit + j * BLOCK_TOKENS;
            if d < hd {
                out[q_base + h * hd + d] = F::cast_from(acc[h * per_unit + j] / running_sum[h]);
            }
        }
    }
}

/// Units per cube of [`paged_decode_unit_keys()`]: one SIMD vector of lavapipe (AVX2).
pub const UNIT_KEYS_UNITS: usize = 8;

/// Decode attention for devices that compute on CPU cores (lavapipe, SwiftShader).
///
/// Cube `(row, kv_head)` as in [`paged_decode()`], but with [`UNIT_KEYS_UNITS`] units and
/// no tile in workgroup memory: unit `u` takes keys `u, u + 8, ..`, reading each K and V
/// row straight into registers, and keeps its own running softmax and output for the
/// `group` query heads. The units' partial results are merged at the end, one query head
/// at a time, through workgroup memory.
///
/// On a CPU every load from a buffer or from workgroup memory is a loop over the SIMD
/// lanes, while registers cost nothing of the kind: [`paged_decode()`] loads each tile value
/// into workgroup memory and reads it back once per query head, this kernel loads it
/// once. On a GPU the registers this needs (queries and outputs of the whole group) would
/// spill, so GPUs keep [`paged_decode()`]. One loop step per key and unit stays far inside
/// llvmpipe's 65,535.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_unit_keys<F: Float, K: KvRows + LaunchArg>(
    q: &Array<F>,
    keys: &K,
    values: &K,
    tables: &Array<u32>,
    row_seq: &Array<u32>,
    row_pos: &Array<u32>,
    out: &mut Array<F>,
    max_blocks: u32,
    n_kv: u32,
    softmax_scale: f32,
    window: u32,
    #[comptime] hd: usize,
    #[comptime] group: usize,
) {
    let row = CUBE_POS_X as usize;
    let head = CUBE_POS_Y as usize;
    let unit = UNIT_POS_X as usize;
    let n_kv = n_kv as usize;
    let n_heads = n_kv * group;
    let seq = row_seq[row] as usize;
    let n_keys = row_pos[row] as usize + 1;
    let first = first_key(n_keys, window as usize);
    let q_base = row * n_heads * hd + head * group * hd;

    let mut q_reg = Array::<f32>::new(comptime!(group * hd));
    let mut acc = Array::<f32>::new(comptime!(group * hd));
    let mut running_max = Array::<f32>::new(group);
    let mut running_sum = Array::<f32>::new(group);
    #[unroll]
    for i in 0..comptime!(group * hd) {
        q_reg[i] = f32::cast_from(q[q_base + i]) * softmax_scale;
        acc[i] = 0.0;
    }
    #[unroll]
    for h in 0..group {
        running_max[h] = f32::new(NEG_BIG);
        running_sum[h] = 0.0;
    }

    let mut row_reg = Array::<f32>::new(hd);
    let mut probs = Array::<f32>::new(group);
    let mut key = first + unit;
    while key < n_keys {
        let entry = tables[seq * max_blocks as usize + key / BLOCK_TOKENS];
        let tier = entry >> TIER_SHIFT;
        let slot = (entry & SLOT_MASK) as usize;
        let arena_row = slot * BLOCK_TOKENS + key % BLOCK_TOKENS;

        keys.read_row(tier, slot, arena_row, head, n_kv, &mut row_reg, hd);
        #[unroll]
        for h in 0..group {
            let mut score = 0.0;
            #[unroll]
            for d in 0..hd {
                score += q_reg[h * hd + d] * row_reg[d];
            }
            let new_max = f32::max(running_max[h], score);
            let correction = f32::exp(running_max[h] - new_max);
            let p = f32::exp(score - new_max);
            running_sum[h] = running_sum[h] * correction + p;
            running_max[h] = new_max;
            probs[h] = p;
            #[unroll]
            for d in 0..hd {
                acc[h * hd + d] *= correction;
            }
        }
        values.read_row(tier, slot, arena_row, head, n_kv, &mut row_reg, hd);
        #[unroll]
        for h in 0..group {
            #[unroll]
            for d in 0..hd {
                acc[h * hd + d] += probs[h] * row_reg[d];
            }
        }
        key += UNIT_KEYS_UNITS;
    }

    // Merge the units' partial results, one query head at a time.
    let mut maxes = SharedMemory::<f32>::new(UNIT_KEYS_UNITS);
    let mut sums = SharedMemory::<f32>::new(UNIT_KEYS_UNITS);
    let mut partial = SharedMemory::<f32>::new(comptime!(UNIT_KEYS_UNITS * hd));
    let mut weights = Array::<f32>::new(UNIT_KEYS_UNITS);
    #[unroll]
    for h in 0..group {
        maxes[unit] = running_max[h];
        sums[unit] = running_sum[h];
        #[unroll]
        for d in 0..hd {
            partial[unit * hd + d] = acc[h * hd + d];
        }
        sync_cube();
        let mut max = f32::new(NEG_BIG);
        #[unroll]
        for u in 0..UNIT_KEYS_UNITS {
            max = f32::max(max, maxes[u]);
        }
        // Units without keys hold NEG_BIG and weigh nothing; unit 0 always has the first.
        let mut total = 0.0;
        #[unroll]
        for u in 0..UNIT_KEYS_UNITS {
            weights[u] = f32::exp(maxes[u] - max);
            total += sums[u] * weights[u];
        }
        #[unroll]
        for j in 0..comptime!(hd.div_ceil(UNIT_KEYS_UNITS)) {
            let d = unit + j * UNIT_KEYS_UNITS;
            if d < hd {
                let mut sum = 0.0;
                #[unroll]
                for u in 0..UNIT_KEYS_UNITS {
                    sum += partial[u * hd + d] * weights[u];
                }
                out[q_base + h * hd + d] = F::cast_from(sum / total);
            }
        }
        sync_cube();
    }
}

/// Prefill attention: causal, up to 32 consecutive query tokens of one sequence per cube.
///
/// `tiles` holds four words per query tile `t`: sequence, first row, first key row
/// (position) and rows. Cube `(query tile, query head)`, 32 units; unit `u` is query row
/// `first row + u` and keeps its query, running softmax and output in registers.
/// The key tiles are read once per query tile and head.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn paged_prefill<F: Float, K: KvRows + LaunchArg>(
    q: &Array<F>,
    keys: &K,
    values: &K,
    tables: &Array<u32>,
    tiles: &Array<u32>,
    out: &mut Array<F>,
    max_blocks: u32,
    n_kv: u32,
    softmax_scale: f32,
    window: u32,
    #[comptime] hd: usize,
    #[comptime] group: usize,
) {
    let qt = CUBE_POS_X as usize;
    let q_head = CUBE_POS_Y as usize;
    let head = q_head / group;
    let unit = UNIT_POS_X as usize;
    let n_kv = n_kv as usize;
    let n_heads = n_kv * group;
    let seq = tiles[qt * 4] as usize;
    let rows = tiles[qt * 4 + 3] as usize;
    let active = unit < rows;
    let first_pos = tiles[qt * 4 + 2] as usize;
    let my_pos = first_pos + unit;
    // Keys every row of the tile may need: up to the last row's position, from the first
    // row's first (row `u` sees keys `my_first..=my_pos`).
    let n_keys = first_pos + rows;
    let window = window as usize;
    let my_first = first_key(my_pos + 1, window);
    let row = tiles[qt * 4 + 1] as usize + unit;
    let q_base = row * n_heads * hd + q_head * hd;

    let mut tile = SharedMemory::<f32>::new(BLOCK_TOKENS * hd);
    let mut q_reg = Array::<f32>::new(hd);
    let mut acc = Array::<f32>::new(hd);
    let mut scores = Array::<f32>::new(BLOCK_TOKENS);
    #[unroll]
    for d in 0..hd {
        acc[d] = 0.0;
        q_reg[d] = 0.0;
    }
    if active {
        #[unroll]
        for d in 0..hd {
            q_reg[d] = f32::cast_from(q[q_base + d]) * softmax_scale;
        }
    }
    let mut running_max = f32::new(NEG_BIG);
    let mut running_sum = f32::new(0.0);

    let n_tiles = n_keys.div_ceil(BLOCK_TOKENS);
    let first_tile = first_key(first_pos + 1, window) / BLOCK_TOKENS;
    for t in first_tile..n_tiles {
        let entry = tables[seq * max_blocks as usize + t];
        let tier = entry >> TIER_SHIFT;
        let slot = (entry & SLOT_MASK) as usize;
        let token = t * BLOCK_TOKENS + unit;
        let valid = token < n_keys;
        let arena_row = slot * BLOCK_TOKENS + unit;

        keys.load_row(
            tier,
            slot,
            arena_row,
            head,
            n_kv,
            valid,
            &mut tile,
            unit * hd,
            hd,
        );
        sync_cube();
        let mut tile_max = f32::new(NEG_BIG);
        for c in 0..comptime!(BLOCK_TOKENS / KEY_CHUNK) {
            #[unroll]
            for i in 0..KEY_CHUNK {
                let k = c * KEY_CHUNK + i;
                let mut score = f32::new(NEG_BIG);
                let key = t * BLOCK_TOKENS + k;
                if key <= my_pos && key >= my_first {
                    score = 0.0;
                    #[unroll]
                    for d in 0..hd {
                        score += q_reg[d] * tile[k * hd + d];
                    }
                }
                scores[k] = score;
                tile_max = f32::max(tile_max, score);
            }
        }
        sync_cube();
        values.load_row(
            tier,
            slot,
            arena_row,
            head,
            n_kv,
            valid,
            &mut tile,
            unit * hd,
            hd,
        );
        sync_cube();
        let new_max = f32::max(running_max, tile_max);
        let correction = f32::exp(running_max - new_max);
        running_sum *= correction;
        #[unroll]
        for d in 0..hd {
            acc[d] *= correction;
        }
        for c in 0..comptime!(BLOCK_TOKENS / KEY_CHUNK) {
            #[unroll]
            for i in 0..KEY_CHUNK {
                let k = c * KEY_CHUNK + i;
                let p = f32::exp(scores[k] - new_max);
                running_sum += p;
                #[unroll]
                for d in 0..hd {
                    acc[d] += p * tile[k * hd + d];
                }
            }
        }
        running_max = new_max;
        sync_cube();
    }

    if active {
        #[unroll]
        for d in 0..hd {
            out[q_base + d] = F::cast_from(acc[d] / running_sum);
        }
    }
}
