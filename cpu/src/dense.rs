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
    let y_ptr = Out(y.as_mut_ptr());
    (0..out.div_ceil(STRIP)).into_par_iter().for_each(|s| {
        let strip = Strip {
            x,
            w,
            inp,
            out,
            c0: s * STRIP,
        };
        // SAFETY: the strip writes only its own columns of `y` `[tokens, out]`.
        unsafe { strip.write(tokens, y_ptr) };
    });
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

impl Strip<'_> {
    /// Columns `c0..c0 + STRIP` (fewer at the end of a row) of every token's output,
    /// written into `y` `[tokens, out]`.
    ///
    /// # Safety
    /// `y` must hold `tokens * out` values that no one else writes in these columns.
    unsafe fn write(&self, tokens: usize, y: Out) {
        let width = (self.out - self.c0).min(STRIP);
        for t0 in (0..tokens).step_by(TOKENS) {
            let n = (tokens - t0).min(TOKENS);
            let mut tile = [[0.0f32; STRIP]; TOKENS];
            self.tile(t0, n, width, &mut tile);
            for (j, acc) in tile[..n].iter().enumerate() {
                // SAFETY: row `t0 + j`, columns `c0..c0 + width`: inside `y`, and only
                // this strip writes them.
                unsafe {
                    let row = y.at((t0 + j) * self.out + self.c0);
                    std::ptr::copy_nonoverlapping(acc.as_ptr(), row, width);
                }
            }
        }
    }

    /// Tokens `t0..t0 + n` over the strip's first `width` columns: with AVX2 where the
    /// CPU has it (the same sums, eight lanes at a time).
    fn tile(&self, t0: usize, n: usize, width: usize, tile: &mut [[f32; STRIP]; TOKENS]) {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            unsafe { self.tile_avx2(t0, n, width, tile) };
            return;
        }
        self.tile_portable(t0, n, width, tile);
    }

    #[inline(always)]
    fn tile_portable(&self, t0: usize, n: usize, width: usize, tile: &mut [[f32; STRIP]; TOKENS]) {
        for i in 0..self.inp {
            let at = i * self.out + self.c0;
            let row = &self.w[at..at + width];
            for (j, acc) in tile[..n].iter_mut().enumerate() {
                let xi = self.x[(t0 + j) * self.inp + i];
                for (a, &wv) in acc.iter_mut().zip(row) {
                    *a += xi * wv;
                }
            }
        }
    }

    /// [`Self::tile_portable`] compiled for AVX2; a whole strip (64 sums per token, eight
    /// vectors) gets its own copy with the width known.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn tile_avx2(&self, t0: usize, n: usize, width: usize, tile: &mut [[f32; STRIP]; TOKENS]) {
        if width == STRIP {
            self.tile_portable(t0, n, STRIP, tile)
        } else {
            self.tile_portable(t0, n, width, tile)
        }
    }
}
