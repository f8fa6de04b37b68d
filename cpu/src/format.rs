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
    /// `d * (q - 16)`, 5-bit codes: four bytes of high bits (bit `j` for value `j`), then
    /// the low nibbles as Q4's.
    Q5_0,
    /// `d * q + m` with FP32 `d` and `m`, 4-bit codes as Q4_1's: a group of 32 of a Q4_K
    /// super-block (`d = d_K * scale`, `m = -dmin_K * min`, both exact in FP32).
    K4,
    /// `d * q + m` with FP32 `d` and `m`, 5-bit codes as Q5_0's: a group of a Q5_K
    /// super-block, or a Q5_1 block.
    K5,
    /// `d_h * q`, signed 8-bit codes with an FP32 scale `d_h` for each half `h` of 16
    /// values: a group of a Q6_K or Q3_K super-block.
    K8,
    /// `d_h * q + m_h`, 4-bit codes as Q4_1's with an FP32 scale and min for each half `h`
    /// of 16 values (scales `d_0, d_1, m_0, m_1`): a group of a Q2_K super-block.
    K2,
}

impl QuantFormat {
    /// Every format, in declaration order (`ALL[f as usize] == f`): the kernels take a
    /// format as a const index into it, so its tests fold away.
    pub const ALL: [QuantFormat; 8] = [
        Self::Q4_0,
        Self::Q4_1,
        Self::Q8_0,
        Self::Q5_0,
        Self::K4,
        Self::K5,
        Self::K8,
        Self::K2,
    ];

    /// Code bytes per block: 16 nibble pairs, 32 bytes, or (Q5_0) 4 bytes of high bits
    /// and 16 nibble pairs.
    pub const fn code_bytes(self) -> usize {
        match self {
            Self::Q8_0 | Self::K8 => 32,
            Self::Q5_0 | Self::K5 => 20,
            _ => 16,
        }
    }

    /// Bytes of high bits at the start of a block's codes (Q5_0's `qh`).
    pub const fn high_bytes(self) -> usize {
        match self {
            Self::Q5_0 | Self::K5 => 4,
            _ => 0,
        }
    }

    /// Whether codes are signed bytes (Q8_0, K8) rather than 4- or 5-bit unsigned codes.
    pub(crate) const fn signed_codes(self) -> bool {
        matches!(self, Self::Q8_0 | Self::K8)
    }

    /// Whether the scales are FP32 (the K formats) rather than IEEE halves.
    pub const fn wide_scales(self) -> bool {
        matches!(self, Self::K4 | Self::K5 | Self::K8 | Self::K2)
    }

    /// Whether each half of 16 values has its own scale (K8, K2), summed apart.
    pub(crate) const fn half_scales(self) -> bool {
        matches!(self, Self::K8 | Self::K2)
    }

    /// Whether a block's product has an offset term `m * sum(x)`.
    pub(crate) const fn has_offset(self) -> bool {
        !self.signed_codes()
    }

    /// Scales per block: `d` (and `m` for Q4_1, K4, K5; K8: one `d` per half; K2: a `d`
    /// and an `m` per half).
    pub const fn scales(self) -> usize {
        match self {
            Self::K2 => 4,
            Self::Q4_1 | Self::K4 | Self::K5 | Self::K8 => 2,
            _ => 1,
        }
    }

    /// Bytes of one scale: 2 (halves) or 4 (FP32).
    pub const fn scale_bytes(self) -> usize {
        if self.wide_scales() {
            4
        } else {
            2
        }
    }

    /// What a block adds per unit of `sum(x)`, given its `d`: `-8 d` for Q4_0, `-16 d` for
    /// Q5_0 (codes read unsigned), 0 for Q8_0 and K8; Q4_1, K4 and K5 carry their own `m`.
    pub(crate) fn offset(self, d: f32) -> f32 {
        match self {
            Self::Q4_0 => -8.0 * d,
            Self::Q5_0 => -16.0 * d,
            _ => 0.0,
        }
    }

    /// 16-bit scale words per block: a half per scale, or two (low first) per FP32 one.
    pub const fn scale_halves(self) -> usize {
        self.scales() * self.scale_bytes() / 2
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
/// (Q4, K4, K2: value `j < 16` in the low nibble of byte `j`, value `j + 16` in its high
/// nibble; Q8_0, K8: one signed byte per value; Q5_0, K5: `qh` then Q4's nibbles) and their
/// scales as 16-bit words: IEEE halves (Q4_1: `d, m` per block), or FP32 values as two
/// words, low first (the K formats). Rows are runs of blocks.
#[derive(Debug, Clone, Copy)]
pub struct QuantWeights<'a> {
    pub(crate) format: QuantFormat,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) codes: &'a [u8],
    pub(crate) scales: &'a [u16],
}

impl<'a> QuantWeights<'a> {
    /// A view of `rows` rows of `cols` values; `scales` may carry one padding word.
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

    /// Block `b` of row `r`'s scale and min for each half: `([d, d], [m, m])`, or K8's
    /// `([d_0, d_1], [0, 0])`, K2's `([d_0, d_1], [m_0, m_1])`.
    fn block_scales(&self, r: usize, b: usize) -> ([f32; 2], [f32; 2]) {
        let words = self.row_scales(r);
        let sh = self.format.scale_halves();
        let scale = |i: usize| scale_at(self.format, &words[b * sh..], i);
        match self.format {
            QuantFormat::K2 => ([scale(0), scale(1)], [scale(2), scale(3)]),
            QuantFormat::K8 => ([scale(0), scale(1)], [0.0; 2]),
            f if f.scales() == 1 => ([scale(0); 2], [f.offset(scale(0)); 2]),
            _ => ([scale(0); 2], [scale(1); 2]),
        }
    }

    /// Row `r` decoded to FP32 into `out` (`cols` values): `d * q + m` per value.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let codes = self.row_codes(r);
        let cb = self.format.code_bytes();
        for (b, values) in out[..self.cols].chunks_exact_mut(QBLOCK).enumerate() {
            let block = &codes[b * cb..(b + 1) * cb];
            let (d, m) = self.block_scales(r, b);
            if self.format.signed_codes() {
                for (j, (v, &q)) in values.iter_mut().zip(block).enumerate() {
                    *v = d[j / 16] * f32::from(q as i8);
                }
                continue;
            }
            let (high, nibbles) = block.split_at(self.format.high_bytes());
            let qh = high_bits(high);
            for (j, &byte) in nibbles.iter().enumerate() {
                let (lo, hi) = five_bit(byte, qh, j);
                values[j] = d[0] * f32::from(lo) + m[0];
                values[j + 16] = d[1] * f32::from(hi) + m[1];
            }
        }
    }
}

/// Scale `i` of a block whose scale words start `words`: a half, or FP32 from two words.
fn scale_at(format: QuantFormat, words: &[u16], i: usize) -> f32 {
    if format.wide_scales() {
        f32::from_bits(u32::from(words[2 * i]) | u32::from(words[2 * i + 1]) << 16)
    } else {
        f16::from_bits(words[i]).to_f32()
    }
}

/// A block's high bits as one word (zero where the format has none).
pub(crate) fn high_bits(high: &[u8]) -> u32 {
    high.iter()
        .enumerate()
        .fold(0, |w, (i, &b)| w | u32::from(b) << (8 * i))
}

/// Codes `j` and `j + 16` of a block from nibble byte `j` and the high bits `qh` (Q4:
/// `qh` is 0).
pub(crate) fn five_bit(byte: u8, qh: u32, j: usize) -> (u8, u8) {
    let bit = |k: usize| ((qh >> k) & 1) as u8;
    ((byte & 15) | bit(j) << 4, (byte >> 4) | bit(j + 16) << 4)
}
