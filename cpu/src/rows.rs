//! Rows of a quantized matrix decoded to FP32: the embedding lookup.

use crate::format::QuantWeights;

impl QuantWeights<'_> {
    /// Rows `ids`, decoded: `[ids.len(), cols]`. Panics on an id past the last row.
    pub fn gather_rows(&self, ids: &[usize]) -> Vec<f32> {
        let mut out = vec![0.0f32; ids.len() * self.cols];
        for (&r, values) in ids.iter().zip(out.chunks_exact_mut(self.cols.max(1))) {
            assert!(r < self.rows, "row {r} of {}", self.rows);
            self.dequantize_row(r, values);
        }
        out
    }
}
