//! Block formats and a borrowed view of a quantized weight matrix.

use half::f16;

/// Values per quantization block.
pub const QBLOCK: usize = 32;

/// Groups of 32 values in a super-block of the K formats (256 values).
pub const SUPER_GROUPS: usize = 8;

/// The GGUF block formats the kernels read.
///
/// The K formats are the K-quants' groups of 32 as the file keeps them: each group's
/// scales are small integers ("steps", one signed byte each) times its super-block's `d`
/// or `-dmin`, two IEEE halves per super-block of [`SUPER_GROUPS`] groups. Their products
/// in FP32 are exact, so a group decodes to the file's values.
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
    /// `d * q + m` with 4-bit codes as Q4_1's and steps `(scale, min)`: a group of 32 of
    /// a Q4_K super-block (`d = d_K * scale`, `m = -dmin_K * min`).
    K4,
    /// As K4 with 5-bit codes as Q5_0's: a group of a Q5_K super-block.
    K5,
    /// `d_h * q`, signed 8-bit codes with steps `(scale_0, scale_1)`, one per half `h` of
    /// 16 values (`d_h = d_K * scale_h`): a group of a Q6_K or Q3_K super-block.
    K8,
    /// `d_h * q + m_h`, 2-bit codes with steps `(scale_0, scale_1, min_0, min_1)`, a
    /// scale and a min for each half `h` of 16 values: a group of a Q2_K super-block.
    /// Codes as crumbs: byte `i < 4` holds values `4c + i` at bits `2c` (`c < 4`), byte
    /// `4 + i` values `16 + 4c + i`, so that a vector shift brings a chunk's codes down.
    K2,
    /// `d * q + m`, 5-bit codes as Q5_0's with IEEE halves `d` and `m`.
    Q5_1,
    /// `d_h * (q - 32)`, 6-bit codes with steps `(scale_0, scale_1)`, one per half `h` of
    /// 16 values: a group of a Q6_K super-block. Eight bytes of high bits, two a value,
    /// then the low nibbles as Q4's: high byte `4p + i` (`p < 2`, `i < 4`) holds those of
    /// values `8p + i`, `16 + 8p + i`, `8p + 4 + i` and `20 + 8p + i` at bits 0, 2, 4 and
    /// 6, so that a vector shift lines up a chunk's high bits with its nibbles.
    K6,
    /// `d_h * (q - 4)`, 3-bit codes with steps `(scale_0, scale_1)`: a group of a Q3_K
    /// super-block. Four bytes of third bits (byte `i` holds those of values `4c + i` at
    /// bit `c` and of `16 + 4c + i` at bit `4 + c`), then K2's crumbs.
    K3,
}

impl QuantFormat {
    /// Every format, in declaration order (`ALL[f as usize] == f`): the kernels take a
    /// format as a const index into it, so its tests fold away.
    pub const ALL: [QuantFormat; 11] = [
        Self::Q4_0,
        Self::Q4_1,
        Self::Q8_0,
        Self::Q5_0,
        Self::K4,
        Self::K5,
        Self::K8,
        Self::K2,
        Self::Q5_1,
        Self::K6,
        Self::K3,
    ];

    /// Code bytes per block: the high bits ([`Self::high_bytes`]), then 16 nibble pairs,
    /// 32 bytes or (K2, K3) 8 bytes of crumbs.
    pub const fn code_bytes(self) -> usize {
        self.high_bytes()
            + match self {
                Self::Q8_0 | Self::K8 => 32,
                Self::K2 | Self::K3 => 8,
                _ => 16,
            }
    }

    /// Bytes of high bits at the start of a block's codes (Q5_0's `qh`; K6's two bits a
    /// value; K3's third bits).
    pub const fn high_bytes(self) -> usize {
        match self {
            Self::Q5_0 | Self::Q5_1 | Self::K5 | Self::K3 => 4,
            Self::K6 => 8,
            _ => 0,
        }
    }

    /// Whether the codes are 2-bit crumbs (K2, K3).
    pub(crate) const fn crumbs(self) -> bool {
        matches!(self, Self::K2 | Self::K3)
    }

    /// Whether codes are signed bytes (Q8_0, K8) rather than 4- or 5-bit unsigned codes.
    pub(crate) const fn signed_codes(self) -> bool {
        matches!(self, Self::Q8_0 | Self::K8)
    }

    /// Whether the scales are steps of a super-block's two halves (the K formats) rather
    /// than IEEE halves of their own.
    pub const fn super_scales(self) -> bool {
        matches!(
            self,
            Self::K4 | Self::K5 | Self::K8 | Self::K2 | Self::K6 | Self::K3
        )
    }

    /// Whether each half of 16 values has its own scale (K8, K2, K6, K3), summed apart.
    pub(crate) const fn half_scales(self) -> bool {
        matches!(self, Self::K8 | Self::K2 | Self::K6 | Self::K3)
    }

    /// Whether each half of 16 values has its own offset (K2, K6, K3), from the
    /// activations' sum over that half.
    pub(crate) const fn half_mins(self) -> bool {
        matches!(self, Self::K2 | Self::K6 | Self::K3)
    }

    /// Whether a block's product has an offset term `m * sum(x)`.
    pub(crate) const fn has_offset(self) -> bool {
        !self.signed_codes()
    }

    /// Scales per block: `d` (and `m` for Q4_1, Q5_1, K4, K5; K8, K6, K3: one `d` per
    /// half; K2: a `d` and an `m` per half).
    pub const fn scales(self) -> usize {
        match self {
            Self::K2 => 4,
            Self::Q4_1 | Self::Q5_1 | Self::K4 | Self::K5 | Self::K8 | Self::K6 | Self::K3 => 2,
            _ => 1,
        }
    }

    /// Bytes of one scale: 2 (an IEEE half) or 1 (a K format's step).
    pub const fn scale_bytes(self) -> usize {
        if self.super_scales() {
            1
        } else {
            2
        }
    }

    /// Bytes of a block's scales.
    pub const fn block_scale_bytes(self) -> usize {
        self.scales() * self.scale_bytes()
    }

    /// What a block adds per unit of `sum(x)`, given its `d`: `-8 d` for Q4_0, `-16 d` for
    /// Q5_0 (codes read unsigned), 0 for Q8_0 and K8; Q4_1, Q5_1, K4 and K5 carry their
    /// own `m`.
    pub(crate) fn offset(self, d: f32) -> f32 {
        match self {
            Self::Q4_0 => -8.0 * d,
            Self::Q5_0 => -16.0 * d,
            _ => 0.0,
        }
    }

    /// 16-bit scale words per block (one or two for the K formats' steps).
    pub const fn scale_halves(self) -> usize {
        self.block_scale_bytes() / 2
    }

    /// Values per row a matrix of this format must hold a whole number of: a block, or
    /// (the K formats) a super-block.
    pub const fn row_multiple(self) -> usize {
        if self.super_scales() {
            QBLOCK * SUPER_GROUPS
        } else {
            QBLOCK
        }
    }

    /// Scale `d` and offset `m` per half of 16 values of a block from its scale bytes
    /// (`steps`: the block's [`Self::block_scale_bytes`]) and, for the K formats, its
    /// super-block's `d` and `-dmin` (`sup`): `([d, d], [m, m])`, K8's `([d_0, d_1], [0,
    /// 0])`, K2's `([d_0, d_1], [m_0, m_1])`, K6's `([d_0, d_1], [-32 d_0, -32 d_1])`,
    /// K3's `([d_0, d_1], [-4 d_0, -4 d_1])`.
    pub(crate) fn block_scales(self, steps: &[u8], sup: [f32; 2]) -> ([f32; 2], [f32; 2]) {
        let step = |i: usize| f32::from(steps[i] as i8);
        let half = |i: usize| {
            f16::from_bits(u16::from_le_bytes([steps[2 * i], steps[2 * i + 1]])).to_f32()
        };
        match self {
            Self::K2 => (
                [sup[0] * step(0), sup[0] * step(1)],
                [sup[1] * step(2), sup[1] * step(3)],
            ),
            Self::K8 => ([sup[0] * step(0), sup[0] * step(1)], [0.0; 2]),
            Self::K6 | Self::K3 => {
                let d = [sup[0] * step(0), sup[0] * step(1)];
                let offset = if self == Self::K6 { -32.0 } else { -4.0 };
                (d, d.map(|d| offset * d))
            }
            Self::K4 | Self::K5 => ([sup[0] * step(0); 2], [sup[1] * step(1); 2]),
            Self::Q4_1 | Self::Q5_1 => ([half(0); 2], [half(1); 2]),
            f => ([half(0); 2], [f.offset(half(0)); 2]),
        }
    }
}

/// Why a [`QuantWeights`] view cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WeightsError {
    /// Rows of `cols` values are not whole blocks (the K formats: super-blocks).
    #[error("{cols} values per row are not whole blocks of {multiple}")]
    PartialBlock { cols: usize, multiple: usize },
    /// The arrays do not hold `rows * cols` values.
    #[error("expected {codes} code bytes, {scales} scale words and {supers} super-block halves for the shape, got {got_codes}, {got_scales} and {got_supers}")]
    Size {
        codes: usize,
        scales: usize,
        supers: usize,
        got_codes: usize,
        got_scales: usize,
        got_supers: usize,
    },
}

/// A `[rows, cols]` block-quantized matrix, borrowed: the blocks' codes as in the file
/// (Q4, K4: value `j < 16` in the low nibble of byte `j`, value `j + 16` in its high
/// nibble; Q8_0, K8: one signed byte per value; Q5_0, Q5_1, K5: `qh` then Q4's nibbles;
/// K6, K3, K2: see their variants),
/// their scales as 16-bit words (IEEE halves, Q4_1 and Q5_1 `d, m` per block; the K
/// formats' steps, two bytes a word, low first) and the K formats' super-block halves
/// (`d, -dmin` per super-block, empty for the others). Rows are runs of blocks.
#[derive(Debug, Clone, Copy)]
pub struct QuantWeights<'a> {
    pub(crate) format: QuantFormat,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) codes: &'a [u8],
    pub(crate) scales: &'a [u16],
    pub(crate) supers: &'a [u16],
}

impl<'a> QuantWeights<'a> {
    /// A view of `rows` rows of `cols` values; `scales` may carry one padding word.
    pub fn new(
        format: QuantFormat,
        rows: usize,
        cols: usize,
        codes: &'a [u8],
        scales: &'a [u16],
        supers: &'a [u16],
    ) -> Result<Self, WeightsError> {
        let multiple = format.row_multiple();
        if !cols.is_multiple_of(multiple) {
            return Err(WeightsError::PartialBlock { cols, multiple });
        }
        let blocks = rows * cols / QBLOCK;
        let want_codes = blocks * format.code_bytes();
        let want_scales = blocks * format.scale_halves();
        let want_supers = match format.super_scales() {
            true => 2 * blocks / SUPER_GROUPS,
            false => 0,
        };
        if codes.len() != want_codes
            || !(want_scales..=want_scales + 1).contains(&scales.len())
            || supers.len() != want_supers
        {
            return Err(WeightsError::Size {
                codes: want_codes,
                scales: want_scales,
                supers: want_supers,
                got_codes: codes.len(),
                got_scales: scales.len(),
                got_supers: supers.len(),
            });
        }
        Ok(Self {
            format,
            rows,
            cols,
            codes,
            scales,
            supers,
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

    /// The block format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Row `r`'s scale bytes, block after block.
    pub(crate) fn row_scale_bytes(&self, r: usize) -> Vec<u8> {
        let n = self.row_blocks() * self.format.scale_halves();
        // Every format's block scales are whole words (`block_scale_bytes` is even).
        let words = &self.scales[r * n..(r + 1) * n];
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// Block `b` of row `r`'s scale and offset per half in FP32: `([d, d], [m, m])`, or
    /// for the formats with a scale per half of 16 values `([d_0, d_1], [m_0, m_1])`.
    pub fn block_scales(&self, r: usize, b: usize) -> ([f32; 2], [f32; 2]) {
        let sh = self.format.scale_halves();
        let at = (r * self.row_blocks() + b) * sh;
        let mut steps = [0u8; 4];
        for (i, w) in self.scales[at..at + sh].iter().enumerate() {
            steps[2 * i..2 * i + 2].copy_from_slice(&w.to_le_bytes());
        }
        self.format
            .block_scales(&steps, super_at(self.row_supers(r), b))
    }

    /// Row `r`'s super-block halves (`d, -dmin` per super-block; empty but for the K
    /// formats).
    pub(crate) fn row_supers(&self, r: usize) -> &'a [u16] {
        let n = 2 * self.row_blocks() / SUPER_GROUPS;
        match self.format.super_scales() {
            true => &self.supers[r * n..(r + 1) * n],
            false => &[],
        }
    }

    /// Row `r` decoded to FP32 into `out` (`cols` values): `d * q + m` per value.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let codes = self.row_codes(r);
        let cb = self.format.code_bytes();
        for (b, values) in out[..self.cols].chunks_exact_mut(QBLOCK).enumerate() {
            let block = &codes[b * cb..(b + 1) * cb];
            let (d, m) = self.block_scales(r, b);
            let q = self.format.block_codes(block);
            for (j, v) in values.iter_mut().enumerate() {
                *v = match self.format.signed_codes() {
                    true => d[j / 16] * q[j] as f32,
                    false => d[j / 16] * q[j] as f32 + m[j / 16],
                };
            }
        }
    }
}

/// Block `b`'s super-block `d` and `-dmin` in FP32 from a row's super-block halves (zeros
/// where there are none).
fn super_at(supers: &[u16], b: usize) -> [f32; 2] {
    let s = 2 * (b / SUPER_GROUPS);
    match supers.get(s..s + 2) {
        Some(h) => [f16::from_bits(h[0]).to_f32(), f16::from_bits(h[1]).to_f32()],
        None => [0.0; 2],
    }
}

impl QuantFormat {
    /// A block's 32 integer codes from its code bytes (high bits first): signed bytes,
    /// or unsigned codes with their high bits.
    pub fn block_codes(self, block: &[u8]) -> [i32; 32] {
        let (high, codes) = block.split_at(self.high_bytes());
        if self.signed_codes() {
            return std::array::from_fn(|j| i32::from(codes[j] as i8));
        }
        if self.crumbs() {
            return std::array::from_fn(|j| {
                let (half, c, i) = (j / 16, j % 16 / 4, j % 4);
                let crumb = (codes[4 * half + i] >> (2 * c)) & 3;
                let third = match self {
                    Self::K3 => (high[i] >> (4 * half + c)) & 1,
                    _ => 0,
                };
                i32::from(crumb | third << 2)
            });
        }
        let mut q = [0i32; 32];
        for (j, &byte) in codes.iter().enumerate() {
            let (lo, hi) = with_high_bits(self, byte, high, j);
            (q[j], q[j + 16]) = (i32::from(lo), i32::from(hi));
        }
        q
    }
}

impl QuantFormat {
    /// A block's code bytes from its 32 integer codes: the inverse of
    /// [`Self::block_codes`] (codes out of the format's range lose their top bits).
    pub fn encode_codes(self, q: &[i32; 32]) -> Vec<u8> {
        let u = q.map(|v| v as u8);
        let mut out = Vec::with_capacity(self.code_bytes());
        if self.signed_codes() {
            out.extend(u);
            return out;
        }
        let fold =
            |bits: &mut dyn Iterator<Item = (usize, u8)>| bits.fold(0u8, |b, (at, v)| b | v << at);
        match self.high_bytes() {
            0 => {}
            // K3's third bits: byte `i`, values `4c + i` at bit `c`, `16 + 4c + i` at `4 + c`.
            4 if self == Self::K3 => out.extend((0..4).map(|i| {
                fold(&mut (0..8).map(|n| (n, u[16 * (n / 4) + 4 * (n % 4) + i] >> 2 & 1)))
            })),
            4 => {
                let qh = (0..32).fold(0u32, |w, j| w | u32::from(u[j] >> 4 & 1) << j);
                out.extend(qh.to_le_bytes());
            }
            // K6: byte `4p + i`, values `8p + i`, `16 + 8p + i`, `8p + 4 + i`, `20 + 8p + i`.
            _ => out.extend((0..8).map(|k| {
                let (p, i) = (k / 4, k % 4);
                let values = [8 * p + i, 16 + 8 * p + i, 8 * p + 4 + i, 20 + 8 * p + i];
                fold(
                    &mut values
                        .iter()
                        .enumerate()
                        .map(|(n, &j)| (2 * n, u[j] >> 4 & 3)),
                )
            })),
        }
        if self.crumbs() {
            // Byte `4h + i`: values `16h + 4c + i` at bits `2c`.
            out.extend((0..8).map(|k| {
                let (h, i) = (k / 4, k % 4);
                fold(&mut (0..4).map(|c| (2 * c, u[16 * h + 4 * c + i] & 3)))
            }));
        } else {
            out.extend((0..16).map(|j| u[j] & 15 | (u[j + 16] & 15) << 4));
        }
        out
    }
}

/// Codes `j` and `j + 16` of a block from nibble byte `j` and the block's high bytes
/// (Q4: none; Q5_0, Q5_1, K5: the fifth bits' word; K6: two bits a value).
pub(crate) fn with_high_bits(format: QuantFormat, byte: u8, high: &[u8], j: usize) -> (u8, u8) {
    let (lo, hi) = (byte & 15, byte >> 4);
    match high.len() {
        0 => (lo, hi),
        8 => {
            debug_assert_eq!(format, QuantFormat::K6);
            let (k, s) = (4 * (j / 8) + j % 4, 4 * (j / 4 % 2));
            let two = |at: usize| (high[k] >> at) & 3;
            (lo | two(s) << 4, hi | two(s + 2) << 4)
        }
        _ => {
            let qh = u32::from_le_bytes([high[0], high[1], high[2], high[3]]);
            let bit = |k: usize| ((qh >> k) & 1) as u8;
            (lo | bit(j) << 4, hi | bit(j + 16) << 4)
        }
    }
}
