//! Block formats and a borrowed view of a quantized weight matrix.

use half::f16;

/// Values per quantization block.
pub const QBLOCK: usize = 32;

/// The GGUF block formats the kernels read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantFormat {
    /// `d * (q - 8)`, 4-bit codes.
    Q4_0,
    /// `d * q + m`, 4-bit codes.
    Q4_1,
    /// `d * q`, signed 8-bit codes.
    Q8_0,
}

impl QuantFormat {
    /// Code bytes per block: 16 nibble pairs or 32 bytes.
    pub const fn code_bytes(self) -> usize {
        match self {
            Self::Q8_0 => 32,
            _ => 16,
        }
    }

    /// Scale halves per block: `d` and `m` for Q4_1, `d` otherwise.
    pub const fn scale_halves(self) -> usize {
        match self {
            Self::Q4_1 => 2,
            _ => 1,
        }
    }
}

/// Why a [`QuantWeights`] view cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WeightsError {
    /// Rows of `cols` values are not whole blocks.
    #[error("{cols} values per row are not whole blocks of {QBLOCK}")]
    PartialBlock { cols: usize },
    /// The arrays do not hold `rows * cols` values.
    #[error("expected {codes} code bytes and {scales} scale halves for the shape, got {got_codes} and {got_scales}")]
    Size {
        codes: usize,
        scales: usize,
        got_codes: usize,
        got_scales: usize,
    },
}

/// A `[rows, cols]` block-quantized matrix, borrowed: the blocks' codes as in the file
/// (Q4: value `j < 16` in the low nibble of byte `j`, value `j + 16` in its high nibble;
/// Q8_0: one signed byte per value) and their scales as IEEE halves (Q4_1: `d, m` per
/// block). Rows are runs of blocks.
#[derive(Debug, Clone, Copy)]
pub struct QuantWeights<'a> {
    pub(crate) format: QuantFormat,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) codes: &'a [u8],
    pub(crate) scales: &'a [u16],
}

impl<'a> QuantWeights<'a> {
    /// A view of `rows` rows of `cols` values; `scales` may carry one padding half.
    pub fn new(
        format: QuantFormat,
        rows: usize,
        cols: usize,
        codes: &'a [u8],
        scales: &'a [u16],
    ) -> Result<Self, WeightsError> {
        if !cols.is_multiple_of(QBLOCK) {
            return Err(WeightsError::PartialBlock { cols });
        }
        let blocks = rows * cols / QBLOCK;
        let want_codes = blocks * format.code_bytes();
        let want_scales = blocks * format.scale_halves();
        if codes.len() != want_codes || !(want_scales..=want_scales + 1).contains(&scales.len()) {
            return Err(WeightsError::Size {
                codes: want_codes,
                scales: want_scales,
                got_codes: codes.len(),
                got_scales: scales.len(),
            });
        }
        Ok(Self {
            format,
            rows,
            cols,
            codes,
            scales,
        })
    }

    /// Rows (outputs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Blocks per row.
    pub(crate) fn row_blocks(&self) -> usize {
        self.cols / QBLOCK
    }

    /// Row `r`'s code bytes.
    pub(crate) fn row_codes(&self, r: usize) -> &'a [u8] {
        let n = self.row_blocks() * self.format.code_bytes();
        &self.codes[r * n..(r + 1) * n]
    }

    /// Row `r`'s scale halves.
    pub(crate) fn row_scales(&self, r: usize) -> &'a [u16] {
        let n = self.row_blocks() * self.format.scale_halves();
        &self.scales[r * n..(r + 1) * n]
    }

    /// Row `r` decoded to FP32 into `out` (`cols` values): `d * q + m` per value.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let codes = self.row_codes(r);
        let scales = self.row_scales(r);
        let half = |i: usize| f16::from_bits(scales[i]).to_f32();
        let cb = self.format.code_bytes();
        for (b, values) in out[..self.cols].chunks_exact_mut(QBLOCK).enumerate() {
            let block = &codes[b * cb..(b + 1) * cb];
            match self.format {
                QuantFormat::Q8_0 => {
                    let d = half(b);
                    for (v, &q) in values.iter_mut().zip(block) {
                        *v = d * f32::from(q as i8);
                    }
                }
                QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
                    let (d, m) = if self.format == QuantFormat::Q4_1 {
                        (half(2 * b), half(2 * b + 1))
                    } else {
                        (half(b), -8.0 * half(b))
                    };
                    for (j, &byte) in block.iter().enumerate() {
                        values[j] = d * f32::from(byte & 15) + m;
                        values[j + 16] = d * f32::from(byte >> 4) + m;
                    }
                }
            }
        }
    }
}
