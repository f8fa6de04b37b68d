//! One group of eight weight rows against a few tokens of quantized activations, per
//! SIMD level.
//!
//! A block's product is `d_w d_x sum(q_w q_x) + m_w s_x`: the integer sum in SIMD, `m_w`
//! being Q4_1's, Q5_1's, K4's and K5's `m`, `-8 d_w` for Q4_0 (whose codes are read as 0..15),
//! `-16 d_w` for Q5_0 and 0 for Q8_0. K8 has a `d_w` per half of 16 values and sums the
//! halves apart: `fma(sum_1, d_w1 d_x, fma(sum_0, d_w0 d_x, acc))`; K2, K3 and K6 too,
//! then add each half's `m_wh s_xh` (`s_xh` the activations' sum over that half; K3's
//! `m_wh` is `-4 d_wh`, K6's `-32 d_wh`). Each lane (row)
//! accumulates `fma(sum, d_w d_x, acc)` then `fma(m_w, s_x, acc)` block by block, whatever
//! the batch, so a token's result does not depend on the tokens beside it.

/// A level's `tokens`: tokens `t0..t0 + n` (`n` at most [`TILE`]) against one group,
/// through the level's `tile::<N, F>` (defined beside it) for the `N` that fits and the
/// format's index `F` in [`QuantFormat::ALL`](crate::format::QuantFormat::ALL), so that
/// each format's tile is compiled on its own, its tests on the format folded away.
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
macro_rules! tokens_by_tile {
    ($features:literal) => {
        /// Tokens `t0..t0 + n` (`n` at most 4) against group `group`.
        ///
        /// # Safety
        /// As [`tile`].
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn tokens(
            format: QuantFormat,
            group: &[u8],
            acts: &crate::activations::Q8Activations,
            t0: usize,
            n: usize,
            out: &mut [[f32; LANES]],
            scales: Option<&[[f32; LANES]]>,
        ) {
            // SAFETY: as the caller guarantees.
            unsafe {
                match format {
                    QuantFormat::Q4_0 => tokens_of::<0>(group, acts, t0, n, out, scales),
                    QuantFormat::Q4_1 => tokens_of::<1>(group, acts, t0, n, out, scales),
                    QuantFormat::Q8_0 => tokens_of::<2>(group, acts, t0, n, out, scales),
                    QuantFormat::Q5_0 => tokens_of::<3>(group, acts, t0, n, out, scales),
                    QuantFormat::K4 => tokens_of::<4>(group, acts, t0, n, out, scales),
                    QuantFormat::K5 => tokens_of::<5>(group, acts, t0, n, out, scales),
                    QuantFormat::K8 => tokens_of::<6>(group, acts, t0, n, out, scales),
                    QuantFormat::K2 => tokens_of::<7>(group, acts, t0, n, out, scales),
                    QuantFormat::Q5_1 => tokens_of::<8>(group, acts, t0, n, out, scales),
                    QuantFormat::K6 => tokens_of::<9>(group, acts, t0, n, out, scales),
                    QuantFormat::K3 => tokens_of::<10>(group, acts, t0, n, out, scales),
                }
            }
        }

        /// [`tokens`] for the format `QuantFormat::ALL[F]`.
        ///
        /// # Safety
        /// As [`tile`].
        #[target_feature(enable = $features)]
        unsafe fn tokens_of<const F: usize>(
            group: &[u8],
            acts: &crate::activations::Q8Activations,
            t0: usize,
            n: usize,
            out: &mut [[f32; LANES]],
            scales: Option<&[[f32; LANES]]>,
        ) {
            let nb = acts.cols / QBLOCK;
            // SAFETY: as the caller guarantees.
            unsafe {
                match n {
                    4 => tile::<4, F>(group, nb, acts.tile(t0), out, scales),
                    3 => tile::<3, F>(group, nb, acts.tile(t0), out, scales),
                    2 => tile::<2, F>(group, nb, acts.tile(t0), out, scales),
                    _ => tile::<1, F>(group, nb, acts.tile(t0), out, scales),
                }
            }
        }
    };
}

#[cfg(target_arch = "aarch64")]
mod arm;
mod portable;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::activations::Q8Activations;
use crate::interleaved::{block_lanes, InterleavedWeights, LANES};
use crate::simd::SimdLevel;

/// Tokens per register tile.
pub(crate) const TILE: usize = 4;

/// `out[j][l] = W[8 g + l] · x[t0 + j]` for `j < n <= TILE` (lanes past the last row are
/// 0). `scales`, where given, is the group's [`expand_scales`], read instead of the K
/// formats' steps: the same values, for products of many tiles.
#[allow(clippy::too_many_arguments)]
pub(crate) fn group_dots(
    level: SimdLevel,
    w: &InterleavedWeights,
    g: usize,
    acts: &Q8Activations,
    t0: usize,
    n: usize,
    out: &mut [[f32; LANES]; TILE],
    scales: Option<&[[f32; LANES]]>,
) {
    assert_eq!(
        acts.cols, w.cols,
        "activations and weights disagree on cols"
    );
    assert!((1..=TILE).contains(&n) && t0 + n <= acts.tokens);
    if let Some(s) = scales {
        assert_eq!(s.len(), w.row_blocks() * w.format.expanded_vectors());
    }
    let group = w.group(g);
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller checked that the level runs on this CPU; the group and the
        // tokens hold the blocks of `w.cols` columns (checked above).
        SimdLevel::Avx2 => unsafe { x86::avx2::tokens(w.format, group, acts, t0, n, out, scales) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx512Vnni => unsafe {
            x86::vnni::tokens(w.format, group, acts, t0, n, out, scales)
        },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above.
        SimdLevel::Neon => unsafe { arm::neon::tokens(w.format, group, acts, t0, n, out, scales) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above.
        SimdLevel::NeonDotprod => unsafe {
            arm::dotprod::tokens(w.format, group, acts, t0, n, out, scales)
        },
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        // SAFETY: the module was built with simd128, so every engine that runs it has it.
        SimdLevel::Simd128 => unsafe {
            wasm::simd128::tokens(w.format, group, acts, t0, n, out, scales)
        },
        _ => portable::tokens(w.format, group, acts, t0, n, out, scales),
    }
}

/// Group `g`'s scales in FP32 into `out`, block after block: `d` and `m` per lane as the
/// kernels take them, then the two mins of the formats with an offset per half
/// (`QuantFormat::expanded_vectors` a block). A
/// product of many tiles of tokens reads these instead of converting the K formats' steps
/// in every tile; the values are the same.
pub(crate) fn expand_scales(
    level: SimdLevel,
    w: &InterleavedWeights,
    g: usize,
    out: &mut [[f32; LANES]],
) {
    let (format, nb) = (w.format, w.row_blocks());
    let k = format.expanded_vectors();
    assert_eq!(out.len(), nb * k, "a group's expanded scales");
    let group = w.group(g);
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller checked that the level runs on this CPU; the group holds
        // `nb` group-blocks and `out` their vectors (checked above).
        SimdLevel::Avx2 => unsafe { x86::avx2::expand(format, group, nb, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx512Vnni => unsafe { x86::vnni::expand(format, group, nb, out) },
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        // SAFETY: as above; the module was built with simd128.
        SimdLevel::Simd128 => unsafe { wasm::simd128::expand(format, group, nb, out) },
        _ => {
            for (b, v) in out.chunks_exact_mut(k).enumerate() {
                v.copy_from_slice(&block_lanes(format, group, nb, b, None)[..k]);
            }
        }
    }
}
