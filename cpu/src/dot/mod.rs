//! One weight row against a batch of quantized activations, per SIMD level.
//!
//! A block's product is `d_w d_x sum(q_w q_x) + m_w s_x`: the integer sum in SIMD, `m_w`
//! being Q4_1's `m`, `-8 d_w` for Q4_0 (whose codes are read as 0..15) and 0 for Q8_0.

mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::activations::Q8Activations;
use crate::format::QuantWeights;
use crate::simd::SimdLevel;

/// `out[t] = W[r] · x[t]` for every token of `acts`; `scratch` holds the row's scales.
pub(crate) fn row_dots(
    level: SimdLevel,
    w: &QuantWeights<'_>,
    r: usize,
    acts: &Q8Activations,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    debug_assert_eq!(acts.cols, w.cols);
    debug_assert_eq!(out.len(), acts.tokens);
    let (codes, halves) = (w.row_codes(r), w.row_scales(r));
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller checked that the level runs on this CPU.
        SimdLevel::Avx2 => unsafe { x86::avx2::row(w.format, codes, halves, acts, out, scratch) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx512Vnni => unsafe {
            x86::vnni::row(w.format, codes, halves, acts, out, scratch)
        },
        // The portable level converts each block's scales where it uses them.
        _ => {
            let _ = scratch;
            portable::row(w.format, codes, halves, acts, out)
        }
    }
}
