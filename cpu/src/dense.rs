//! `x @ W` with `W` FP32 and stored `[in, out]` (the model's dense weights), read where it
//! lies (no copy). A few tokens (decoding): column strips of `W` split over the thread
//! pool, each strip read once per tile of tokens, so a decode step reads each weight once,
//! as the quantized kernels do. More tokens: `matrixmultiply`'s blocked product on column
//! blocks of `W`, one per piece of work on the pool.

use rayon::prelude::*;

/// Columns of `W` in one strip: the tile's sums (`TOKENS x STRIP`) stay in L1.
const STRIP: usize = 64;
/// Tokens multiplied per pass over a strip.
const TOKENS: usize = 4;
/// Most tokens multiplied strip by strip; more go to the blocked product, which packs
/// `W` once per call and pays that back over the tokens.
const STRIP_MAX_TOKENS: usize = 8;
/// Pieces of work per thread of the blocked product.
const PIECES_PER_THREAD: usize = 2;

/// `x @ W` for `x` `[tokens, inp]` and `w` `[inp, out]`, both row-major: `[tokens, out]`.
pub fn matmul_f32(x: &[f32], tokens: usize, w: &[f32], inp: usize, out: usize) -> Vec<f32> {
    assert_eq!(x.len(), tokens * inp, "x is [tokens, inp]");
    assert_eq!(w.len(), inp * out, "w is [inp, out]");
    if tokens > STRIP_MAX_TOKENS {
        return blocked(x, tokens, w, inp, out);
    }
    let mut y = vec![0.0f32; tokens * out];
    if tokens == 0 || out == 0 {
        return y;
    }
    let strips = out.div_ceil(STRIP);
    let sums: Vec<(usize, Vec<f32>)> = (0..strips)
        .into_par_iter()
        .map(|s| (s, strip_sums(x, tokens, w, inp, out, s * STRIP)))
        .collect();
    for (s, sums) in sums {
        let (c0, width) = (s * STRIP, (out - s * STRIP).min(STRIP));
        for t in 0..tokens {
            y[t * out + c0..t * out + c0 + width]
                .copy_from_slice(&sums[t * STRIP..t * STRIP + width]);
        }
    }
    y
}

/// The output's memory, written by several pieces at once: each its own columns.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: pieces write disjoint columns, and the buffer outlives the parallel pass.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// The element `i` places in.
    ///
    /// # Safety
    /// `i` must lie inside the buffer.
    unsafe fn at(self, i: usize) -> *mut f32 {
        // SAFETY: the caller keeps `i` inside the buffer.
        unsafe { self.0.add(i) }
    }
}

/// [`matmul_f32`] for many tokens: `matrixmultiply::sgemm` on column blocks of `W`
/// (multiples of 16 columns), in parallel.
fn blocked(x: &[f32], tokens: usize, w: &[f32], inp: usize, out: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; tokens * out];
    let pieces = rayon::current_num_threads() * PIECES_PER_THREAD;
    let width = out.div_ceil(pieces).next_multiple_of(16).max(16);
    let y_ptr = Out(y.as_mut_ptr());
    (0..out.div_ceil(width)).into_par_iter().for_each(|b| {
        let (c0, n) = (b * width, (out - b * width).min(width));
        // SAFETY: A is `x` `[tokens, inp]`, B columns `c0..c0 + n` of `w` `[inp, out]`, C
        // the same columns of `y` `[tokens, out]`: every index is inside its buffer, and
        // no other piece writes these columns of `y`.
        unsafe {
            matrixmultiply::sgemm(
                tokens,
                inp,
                n,
                1.0,
                x.as_ptr(),
                inp as isize,
                1,
                w.as_ptr().add(c0),
                out as isize,
                1,
                0.0,
                y_ptr.at(c0),
                out as isize,
                1,
            )
        };
    });
    y
}

/// The operands of one product, and the first column of the strip being summed.
struct Strip<'a> {
    x: &'a [f32],
    w: &'a [f32],
    inp: usize,
    out: usize,
    c0: usize,
}

/// Sums of every token for columns `c0..c0 + STRIP` (those past `out` stay zero):
/// `[tokens, STRIP]`.
fn strip_sums(x: &[f32], tokens: usize, w: &[f32], inp: usize, out: usize, c0: usize) -> Vec<f32> {
    let strip = Strip { x, w, inp, out, c0 };
    let width = (out - c0).min(STRIP);
    let mut sums = vec![0.0f32; tokens * STRIP];
    for t0 in (0..tokens).step_by(TOKENS) {
        let n = (tokens - t0).min(TOKENS);
        let mut tile = [[0.0f32; STRIP]; TOKENS];
        if width == STRIP {
            tile_full(&strip, t0, n, &mut tile);
        } else {
            for i in 0..inp {
                let row = &w[i * out + c0..i * out + c0 + width];
                for (j, acc) in tile[..n].iter_mut().enumerate() {
                    let xi = x[(t0 + j) * inp + i];
                    for (a, &wv) in acc.iter_mut().zip(row) {
                        *a += xi * wv;
                    }
                }
            }
        }
        for (j, acc) in tile[..n].iter().enumerate() {
            sums[(t0 + j) * STRIP..(t0 + j + 1) * STRIP].copy_from_slice(acc);
        }
    }
    sums
}

/// Tokens `t0..t0 + n` over a whole strip: with AVX2 where the CPU has it (the same sums,
/// eight lanes at a time).
fn tile_full(s: &Strip, t0: usize, n: usize, tile: &mut [[f32; STRIP]; TOKENS]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        unsafe { tile_avx2(s, t0, n, tile) };
        return;
    }
    tile_portable(s, t0, n, tile);
}

#[inline(always)]
fn tile_portable(s: &Strip, t0: usize, n: usize, tile: &mut [[f32; STRIP]; TOKENS]) {
    for i in 0..s.inp {
        let at = i * s.out + s.c0;
        let row: &[f32; STRIP] = s.w[at..at + STRIP].try_into().expect("a whole strip");
        for (j, acc) in tile[..n].iter_mut().enumerate() {
            let xi = s.x[(t0 + j) * s.inp + i];
            for (a, &wv) in acc.iter_mut().zip(row) {
                *a += xi * wv;
            }
        }
    }
}

/// [`tile_portable`] compiled for AVX2: the strip's 64 sums per token are eight vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn tile_avx2(s: &Strip, t0: usize, n: usize, tile: &mut [[f32; STRIP]; TOKENS]) {
    tile_portable(s, t0, n, tile)
}
