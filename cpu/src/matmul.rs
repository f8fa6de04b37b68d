//! `x @ W^T` with `W` block-quantized: rows split over the thread pool, each row read once
//! for every token of the batch. Several weights applied to the same input (Q, K and V;
//! gate and up) share one quantization of it and one parallel pass.

use rayon::prelude::*;

use crate::activations::Q8Activations;
use crate::dot::row_dots;
use crate::format::QuantWeights;
use crate::simd::SimdLevel;

/// Pieces of work per thread, so that a thread that falls behind is not waited for long.
const PIECES_PER_THREAD: usize = 4;
/// Fewest rows in a piece: below this, handing a piece to a thread costs more than it saves.
const MIN_PIECE_ROWS: usize = 16;

impl QuantWeights<'_> {
    /// `x @ W^T` for `x` of `tokens` rows of `cols` FP32 values: `[tokens, rows]`, on the
    /// best SIMD level of this CPU.
    pub fn matmul(&self, x: &[f32], tokens: usize) -> Vec<f32> {
        let acts = Q8Activations::quantize(x, tokens, self.cols);
        self.matmul_q8(&acts, SimdLevel::best())
    }

    /// `x @ W^T` over activations already quantized, on `level` (which must be one of
    /// [`SimdLevel::available`]): `[tokens, rows]`.
    pub fn matmul_q8(&self, acts: &Q8Activations, level: SimdLevel) -> Vec<f32> {
        matmul_many(&[*self], acts, level)
            .pop()
            .expect("one weight, one product")
    }
}

/// `x @ W_i^T` for every weight (all with `x`'s `cols`), in one parallel pass over all
/// their rows: `[tokens, rows_i]` each.
pub fn matmul_many(
    weights: &[QuantWeights<'_>],
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
    let total_rows: usize = weights.iter().map(|w| w.rows).sum();
    let pieces = rayon::current_num_threads() * PIECES_PER_THREAD;
    let piece_rows = total_rows.div_ceil(pieces).max(MIN_PIECE_ROWS);
    // Row-major over weight rows: each piece writes a contiguous run.
    let mut by_row: Vec<Vec<f32>> = weights.iter().map(|w| vec![0.0; w.rows * tokens]).collect();
    if tokens > 0 {
        let mut work = Vec::new();
        for (w, buf) in weights.iter().zip(by_row.iter_mut()) {
            for (p, part) in buf.chunks_mut(piece_rows * tokens).enumerate() {
                work.push((w, p * piece_rows, part));
            }
        }
        work.into_par_iter().for_each(|(w, first, part)| {
            let mut scratch = Vec::new();
            for (i, out) in part.chunks_exact_mut(tokens).enumerate() {
                row_dots(level, w, first + i, acts, out, &mut scratch);
            }
        });
    }
    by_row
        .into_iter()
        .zip(weights)
        .map(|(values, w)| transpose(values, w.rows, tokens))
        .collect()
}

/// `[rows, tokens]` to `[tokens, rows]`.
fn transpose(by_row: Vec<f32>, rows: usize, tokens: usize) -> Vec<f32> {
    if tokens <= 1 {
        return by_row;
    }
    let mut out = vec![0.0f32; tokens * rows];
    for (r, values) in by_row.chunks_exact(tokens).enumerate() {
        for (t, &v) in values.iter().enumerate() {
            out[t * rows + r] = v;
        }
    }
    out
}

/// Seconds `level` takes (best of five) for a cache-resident Q4_1 product of 128 rows of
/// 576 values with 4 tokens, on this thread.
pub(crate) fn time_level(level: SimdLevel) -> f64 {
    use crate::format::QuantFormat;
    let (rows, cols, tokens) = (128, 576, 4);
    let blocks = rows * cols / crate::format::QBLOCK;
    let codes: Vec<u8> = (0..blocks * 16).map(|i| (i * 37 % 251) as u8).collect();
    let scales: Vec<u16> = (0..blocks * 2).map(|i| 0x2000 + (i % 512) as u16).collect();
    let w = QuantWeights::new(QuantFormat::Q4_1, rows, cols, &codes, &scales)
        .expect("a consistent shape");
    let x: Vec<f32> = (0..tokens * cols)
        .map(|i| (i as f32 * 0.01).sin())
        .collect();
    let acts = Q8Activations::quantize(&x, tokens, cols);
    let (mut out, mut scratch) = (vec![0.0f32; tokens], Vec::new());
    (0..5)
        .map(|_| {
            let t = std::time::Instant::now();
            for r in 0..rows {
                row_dots(level, &w, r, &acts, &mut out, &mut scratch);
            }
            std::hint::black_box(&out);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}
