//! `x @ W^T` with `W` block-quantized and interleaved: groups of eight rows split over the
//! thread pool, each group read once per tile of tokens. Several weights applied to the
//! same input (Q, K and V; gate and up) share one quantization of it and one parallel pass.

use rayon::prelude::*;

use crate::activations::Q8Activations;
use crate::dot::{expand_scales, group_dots, TILE};
use crate::format::QuantWeights;
use crate::interleaved::{InterleavedWeights, LANES};
use crate::simd::SimdLevel;

/// Pieces of work per thread, so that a thread that falls behind is not waited for long.
const PIECES_PER_THREAD: usize = 4;
/// Fewest tokens for which a product expands the K formats' scales to FP32 once rather
/// than converting them in every tile.
const EXPAND_TOKENS: usize = 4 * TILE;
/// Fewest row groups in a piece: below this, handing a piece to a thread costs more than
/// it saves.
const MIN_PIECE_GROUPS: usize = 2;

impl InterleavedWeights {
    /// `x @ W^T` over activations already quantized, on `level` (which must be one of
    /// [`SimdLevel::available`]): `[tokens, rows]`.
    pub fn matmul_q8(&self, acts: &Q8Activations, level: SimdLevel) -> Vec<f32> {
        matmul_many(&[self], acts, level)
            .pop()
            .expect("one weight, one product")
    }
}

/// The outputs' memory, written by several threads at once: each piece of work writes
/// its own rows' columns.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: pieces write disjoint elements (their own row groups), and the buffers outlive
// the parallel pass.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// `x @ W_i^T` for every weight (all with `x`'s `cols`), in one parallel pass over all
/// their row groups: `[tokens, rows_i]` each.
pub fn matmul_many(
    weights: &[&InterleavedWeights],
    acts: &Q8Activations,
    level: SimdLevel,
) -> Vec<Vec<f32>> {
    assert!(
        level.is_available(),
        "{} is not available on this CPU",
        level.name()
    );
    for w in weights {
        assert_eq!(
            acts.cols, w.cols,
            "activations and weights disagree on cols"
        );
    }
    let tokens = acts.tokens;
    let mut outs: Vec<Vec<f32>> = weights.iter().map(|w| vec![0.0; tokens * w.rows]).collect();
    if tokens == 0 {
        return outs;
    }
    let total: usize = weights.iter().map(|w| w.groups()).sum();
    let pieces = rayon::current_num_threads() * PIECES_PER_THREAD;
    let per_piece = total.div_ceil(pieces).max(MIN_PIECE_GROUPS);
    let mut work = Vec::new();
    for (w, out) in weights.iter().zip(outs.iter_mut()) {
        let out = Out(out.as_mut_ptr());
        for g0 in (0..w.groups()).step_by(per_piece) {
            work.push((*w, out, g0..(g0 + per_piece).min(w.groups())));
        }
    }
    work.into_par_iter().for_each(|(w, out, groups)| {
        let mut tile = [[0.0f32; LANES]; TILE];
        // The K formats' scales in FP32 once, where enough tiles read them.
        let k = w.format.expanded_vectors() * w.row_blocks();
        let mut expanded = Vec::new();
        if w.format.super_scales() && tokens >= EXPAND_TOKENS {
            expanded = vec![[0.0f32; LANES]; groups.len() * k];
            for (g, out) in groups.clone().zip(expanded.chunks_exact_mut(k)) {
                expand_scales(level, w, g, out);
            }
        }
        for t0 in (0..tokens).step_by(TILE) {
            let n = (tokens - t0).min(TILE);
            for g in groups.clone() {
                let at = (g - groups.start) * k;
                let scales = expanded.get(at..at + k);
                group_dots(level, w, g, acts, t0, n, &mut tile, scales);
                let (first, lanes) = (g * LANES, (w.rows - g * LANES).min(LANES));
                for (j, values) in tile[..n].iter().enumerate() {
                    // SAFETY: row `t0 + j` of `[tokens, rows]`, columns `first..first +
                    // lanes`: inside the buffer, and only this piece writes them.
                    unsafe {
                        let at = out.0.add((t0 + j) * w.rows + first);
                        std::ptr::copy_nonoverlapping(values.as_ptr(), at, lanes);
                    }
                }
            }
        }
    });
    outs
}

impl SimdLevel {
    /// The fastest level on this CPU, measured once: a newer instruction set is not
    /// always the faster one (on the Xeon we develop on, 256-bit `vpdpbusd` measured
    /// 2.0 ns per block and token in a four-token tile where AVX2 took 1.6).
    pub fn best() -> Self {
        static BEST: std::sync::OnceLock<SimdLevel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let levels = Self::available();
            if levels.len() <= 2 {
                return *levels.last().expect("portable is always there");
            }
            // Every SIMD level on a small product (cache-resident, one thread), best of
            // five: about a millisecond in all.
            levels[1..]
                .iter()
                .copied()
                .min_by(|a, b| time_level(*a).total_cmp(&time_level(*b)))
                .expect("levels to compare")
        })
    }
}

/// Seconds `level` takes (best of five) for a cache-resident Q4_1 product of 128 rows of
/// 576 values with 4 tokens, on this thread.
pub(crate) fn time_level(level: SimdLevel) -> f64 {
    use crate::format::QuantFormat;
    let (rows, cols, tokens) = (128, 576, 4);
    let blocks = rows * cols / crate::format::QBLOCK;
    let codes: Vec<u8> = (0..blocks * 16).map(|i| (i * 37 % 251) as u8).collect();
    let scales: Vec<u16> = (0..blocks * 2).map(|i| 0x2000 + (i % 512) as u16).collect();
    let w = QuantWeights::new(QuantFormat::Q4_1, rows, cols, &codes, &scales, &[])
        .expect("a consistent shape");
    let w = InterleavedWeights::new(&w);
    let x: Vec<f32> = (0..tokens * cols)
        .map(|i| (i as f32 * 0.01).sin())
        .collect();
    let acts = Q8Activations::quantize(&x, tokens, cols);
    let mut tile = [[0.0f32; LANES]; TILE];
    (0..5)
        .map(|_| {
            let t = std::time::Instant::now();
            for g in 0..w.groups() {
                group_dots(level, &w, g, &acts, 0, tokens, &mut tile, None);
            }
            std::hint::black_box(&tile);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}
