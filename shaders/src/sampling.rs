//! Sampling where the logits are: one cube per row picks the token as the host sampler
//! would (temperature, top-k, top-p, then the inverse of the cumulative distribution at a
//! uniform draw made on the host from the request's seeded generator), so a step reads
//! back one id per sequence.
//!
//! The cube ranks the row's [`WINDOW`] most likely tokens in the host's order (scaled
//! logit descending, index ascending) by repeated block-wide maxima. Every candidate the
//! host would keep lies in that window when top-k is at most [`WINDOW`], when top-p stops
//! inside it, or when the draw lands inside it; otherwise the row answers [`FALLBACK`] and
//! the host samples it from the logits with the same draw. The normaliser over the whole
//! row (no top-k) is a parallel sum, the host's a sequential one: probabilities may differ
//! in their last bits, so a draw within about `1e-6` of a boundary may pick the neighbour.
//!
//! Barriers sit only in control flow that is uniform by construction (constant loop
//! bounds), as WebGPU requires.

use crate::layer_ops::cube_sum;
use cubecl::prelude::*;

/// Units per row.
pub const SAMPLE_UNITS: usize = 256;
const SAMPLE_LEVELS: usize = 8;
/// Most candidates a row ranks on the device; a larger top-k samples on the host.
pub const WINDOW: usize = 64;
/// The id a row answers when its token lies beyond the window.
pub const FALLBACK: u32 = u32::MAX;
/// Values per row of the parameters: temperature, top-k (0: all), top-p, the draw.
pub const PARAMS: usize = 4;

const NONE: u32 = u32::MAX;
const BIG: f32 = f32::MAX;

/// Whether `(v, i)` comes before `(bv, bi)` in the host's order; `bi == NONE` is empty.
#[cube]
fn before(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    bi == NONE || v > bv || (v == bv && i < bi)
}

/// `out[row]`: the token of `logits[row]` (`vocab` wide) under `params[row]`.
#[cube(launch)]
// CubeCL expands comparisons, not `RangeInclusive::contains`.
#[allow(clippy::manual_range_contains)]
pub fn sample_rows<L: Float>(
    logits: &Array<L>,
    params: &Array<f32>,
    out: &mut Array<u32>,
    vocab: u32,
) {
    let row = CUBE_POS_X as usize;
    let unit = UNIT_POS_X as usize;
    let n = vocab as usize;
    let base = row * n;
    let temperature = params[row * PARAMS];
    let top_k = u32::cast_from(params[row * PARAMS + 1usize]);
    let top_p = params[row * PARAMS + 2usize];
    let draw = params[row * PARAMS + 3usize];
    let mut window = u32::new(WINDOW as i64);
    if top_k > 0 && top_k < window {
        window = top_k;
    }

    let mut red_v = SharedMemory::<f32>::new(SAMPLE_UNITS);
    let mut red_i = SharedMemory::<u32>::new(SAMPLE_UNITS);
    let mut cand_v = SharedMemory::<f32>::new(WINDOW);
    let mut cand_i = SharedMemory::<u32>::new(WINDOW);
    let mut found = SharedMemory::<u32>::new(1usize);
    if unit == 0usize {
        found[0] = 0u32;
    }

    // Rank: round j finds the best candidate after round j - 1's.
    let mut last_v = f32::new(0.0);
    let mut last_i = u32::new(NONE as i64);
    let mut done = u32::new(0);
    for j in 0u32..WINDOW as u32 {
        let mut bv = f32::new(0.0);
        let mut bi = u32::new(NONE as i64);
        if done == 0 && j < window {
            let mut i = unit;
            while i < n {
                let x = f32::cast_from(logits[base + i]);
                if x >= -BIG && x <= BIG {
                    let s = x / temperature;
                    let idx = i as u32;
                    let after = j == 0 || s < last_v || (s == last_v && idx > last_i);
                    if after && before(s, idx, bv, bi) {
                        bv = s;
                        bi = idx;
                    }
                }
                i += SAMPLE_UNITS;
            }
        }
        red_v[unit] = bv;
        red_i[unit] = bi;
        sync_cube();
        #[unroll]
        for level in 0..SAMPLE_LEVELS {
            let stride = comptime!(SAMPLE_UNITS >> (level + 1));
            if unit < stride {
                let (ov, oi) = (red_v[unit + stride], red_i[unit + stride]);
                if oi != NONE && before(ov, oi, red_v[unit], red_i[unit]) {
                    red_v[unit] = ov;
                    red_i[unit] = oi;
                }
            }
            sync_cube();
        }
        last_v = red_v[0];
        last_i = red_i[0];
        if last_i == NONE {
            done = 1;
        } else if unit == 0usize {
            cand_v[j as usize] = last_v;
            cand_i[j as usize] = last_i;
            found[0] = j + 1u32;
        }
        sync_cube();
    }

    // The normaliser over the whole row, for sampling without top-k.
    let top = cand_v[0];
    let mut part = f32::new(0.0);
    if found[0] > 0 {
        let mut i = unit;
        while i < n {
            let x = f32::cast_from(logits[base + i]);
            if x >= -BIG && x <= BIG {
                part += f32::exp(x / temperature - top);
            }
            i += SAMPLE_UNITS;
        }
    }
    let row_sum = cube_sum(&mut red_v, unit, part, SAMPLE_UNITS);

    if unit == 0usize {
        let count = found[0] as usize;
        let mut token = u32::new(FALLBACK as i64);
        if count > 0usize {
            // With top-k the host normalises over the kept candidates, in order.
            let mut norm = row_sum;
            if top_k > 0 {
                norm = 0.0;
                let mut j = 0usize;
                while j < count {
                    norm += f32::exp(cand_v[j] - top);
                    j += 1usize;
                }
            }
            // The window holds every candidate: top-k, or fewer finite logits than it.
            let all_inside = top_k > 0 || count < WINDOW;
            let mut keep = count;
            let mut cut = u32::new(0);
            if top_p < 1.0 {
                let mut acc = f32::new(0.0);
                let mut j = 0usize;
                while j < count {
                    if cut == 0 {
                        acc += f32::exp(cand_v[j] - top) / norm;
                        if acc >= top_p {
                            keep = j + 1usize;
                            cut = 1;
                        }
                    }
                    j += 1usize;
                }
            }
            let exact = all_inside || cut == 1;
            // The host scales the draw by the kept probabilities' sum (1 when all are
            // kept, up to rounding).
            let mut total = f32::new(1.0);
            if exact {
                total = 0.0;
                let mut j = 0usize;
                while j < keep {
                    total += f32::exp(cand_v[j] - top) / norm;
                    j += 1usize;
                }
            }
            let mut r = draw * total;
            let mut chosen = u32::new(0);
            let mut j = 0usize;
            while j < keep {
                if chosen == 0 {
                    let p = f32::exp(cand_v[j] - top) / norm;
                    if r < p {
                        token = cand_i[j];
                        chosen = 1;
                    } else {
                        r -= p;
                    }
                }
                j += 1usize;
            }
            if chosen == 0 && exact {
                token = cand_i[keep - 1usize];
            }
        }
        out[row] = token;
    }
}
