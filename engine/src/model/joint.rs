//! Projections of one input (Q, K and V; gate and up) held as one matrix where their
//! weights allow, so that one product, and the epilogue of a fused kernel, covers them all.

use burn_tensor::{backend::Backend, Tensor};

use super::Linear;
use crate::quant::{QuantMatrix, QuantOps};

/// How the parts' rows sit in a joined matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// One part after another: `[q | k | v]`.
    Stacked,
    /// Row by row: part `p`'s row `j` at `parts * j + p` (gate and up, for SwiGLU's
    /// epilogue, which takes two adjacent rows).
    Interleaved,
}

/// Several projections of the same input.
#[derive(Debug, Clone)]
pub enum Joint<B: Backend> {
    /// One quantized layer over every part's rows.
    One {
        layer: Linear<B>,
        /// Each part's output width.
        widths: Vec<usize>,
        rows: Rows,
    },
    /// One layer per part: weights that cannot join (different formats, FP32) or a
    /// backend without fused kernels.
    Parts(Vec<Linear<B>>),
}

impl<B: Backend> Joint<B> {
    /// The layers holding the weights: one, or one per part.
    pub fn layers(&self) -> impl Iterator<Item = &Linear<B>> {
        let (one, parts) = match self {
            Joint::One { layer, .. } => (Some(layer), &[][..]),
            Joint::Parts(p) => (None, &p[..]),
        };
        one.into_iter().chain(parts)
    }

    /// The joined quantized matrix and its row arrangement, if the parts are one.
    pub fn joined(&self) -> Option<(&QuantMatrix<B>, Rows)> {
        match self {
            Joint::One { layer, rows, .. } => layer.quant().map(|q| (q, *rows)),
            Joint::Parts(_) => None,
        }
    }
}

impl<B: QuantOps> Joint<B> {
    /// Each part applied to `x` `[tokens, in]`: `[tokens, width]` per part, in order.
    pub fn forward(&self, x: Tensor<B, 2>) -> Vec<Tensor<B, 2>> {
        match self {
            Joint::Parts(layers) => Linear::forward_many(x, layers),
            Joint::One {
                layer,
                widths,
                rows,
            } => split(layer.forward(x), widths, *rows),
        }
    }
}

/// The parts of a joined product `out` `[tokens, sum of widths]` whose rows were joined
/// as `rows`: `[tokens, width]` each, in order (interleaved parts share one width).
pub(crate) fn split<B: Backend>(
    out: Tensor<B, 2>,
    widths: &[usize],
    rows: Rows,
) -> Vec<Tensor<B, 2>> {
    let [tokens, _] = out.dims();
    match rows {
        Rows::Stacked => {
            let mut at = 0;
            widths
                .iter()
                .map(|&w| {
                    at += w;
                    out.clone().narrow(1, at - w, w)
                })
                .collect()
        }
        Rows::Interleaved => {
            let (n, width) = (widths.len(), widths[0]);
            let out = out.reshape([tokens, width, n]);
            (0..n)
                .map(|p| out.clone().narrow(2, p, 1).reshape([tokens, width]))
                .collect()
        }
    }
}
