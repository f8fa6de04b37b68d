//! The CPU kernels' weight layout: the file's blocks with eight rows interleaved, so that
//! one SIMD product covers a block of eight rows and its results land one row per lane.
//!
//! Rows are taken in groups of [`LANES`] (the last group padded with zero rows). A group
//! is a run of group-blocks, one per block of 32 columns, each holding:
//! - the eight rows' `d` as IEEE halves (FP32 for the K formats), then (Q4_1, K4, K5)
//!   their eight `m` (K8: their eight second-half `d`; K2: the second-half `d`, then the
//!   first and the second half's `m`);
//! - (Q5_0, K5) the eight rows' high-bit words `qh`, row `l`'s at `4l`;
//! - the eight rows' codes in chunks of 32 bytes: chunk `c` holds 4 bytes of each row,
//!   row `l`'s bytes `4c..4c + 4` of its block at `32c + 4l`. For Q4 that is values
//!   `4c..4c + 4` in the low nibbles and `16 + 4c..` in the high ones; for Q8_0 and K8
//!   values `4c..4c + 4`.
//!
//! It takes the same bytes as the blocks it is made from (plus the padding rows).

use half::f16;

use crate::format::{QuantFormat, QuantWeights, QBLOCK};

/// Rows per group: the lanes of one 256-bit vector of FP32.
pub const LANES: usize = 8;

/// A `[rows, cols]` block-quantized matrix in the kernels' interleaved layout, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct InterleavedWeights {
    pub(crate) format: QuantFormat,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) data: Vec<u8>,
}

/// Where row `l`'s 16-bit scale word `h` of a block lies in a group-block: scale `s` of
/// the eight rows is a run of eight halves or FP32 values.
const fn scale_offset(format: QuantFormat, l: usize, h: usize) -> usize {
    let per = format.scale_bytes() / 2;
    let (s, part) = (h / per, h % per);
    (s * LANES + l) * format.scale_bytes() + 2 * part
}

/// Where row `l`'s code byte `i` of a block lies among a group-block's codes.
const fn code_offset(l: usize, i: usize) -> usize {
    (i / 4) * 32 + l * 4 + i % 4
}

impl QuantFormat {
    /// Bytes of one group-block: eight rows' scales and codes.
    pub(crate) const fn group_block_bytes(self) -> usize {
        LANES * (2 * self.scale_halves() + self.code_bytes())
    }

    /// Where the high-bit words start in a group-block (Q5_0).
    pub(crate) const fn group_high_at(self) -> usize {
        LANES * 2 * self.scale_halves()
    }

    /// Where the codes start in a group-block.
    pub(crate) const fn group_codes_at(self) -> usize {
        self.group_high_at() + LANES * self.high_bytes()
    }
}

impl InterleavedWeights {
    /// The same matrix with its rows interleaved.
    pub fn new(w: &QuantWeights<'_>) -> Self {
        let format = w.format;
        let nb = w.row_blocks();
        let groups = w.rows.div_ceil(LANES);
        let (gbb, codes_at) = (format.group_block_bytes(), format.group_codes_at());
        let (cb, sh, hb) = (
            format.code_bytes(),
            format.scale_halves(),
            format.high_bytes(),
        );
        let high_at = format.group_high_at();
        let mut data = vec![0u8; groups * nb * gbb];
        for r in 0..w.rows {
            let (g, l) = (r / LANES, r % LANES);
            let (codes, halves) = (w.row_codes(r), w.row_scales(r));
            for b in 0..nb {
                let at = (g * nb + b) * gbb;
                let block = &mut data[at..at + gbb];
                for (h, word) in halves[b * sh..(b + 1) * sh].iter().enumerate() {
                    let o = scale_offset(format, l, h);
                    block[o..o + 2].copy_from_slice(&word.to_le_bytes());
                }
                let own = &codes[b * cb..(b + 1) * cb];
                block[high_at + hb * l..high_at + hb * (l + 1)].copy_from_slice(&own[..hb]);
                for (i, &byte) in own[hb..].iter().enumerate() {
                    block[codes_at + code_offset(l, i)] = byte;
                }
            }
        }
        Self {
            format,
            rows: w.rows,
            cols: w.cols,
            data,
        }
    }

    /// The block format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Rows (outputs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Blocks per row.
    pub(crate) fn row_blocks(&self) -> usize {
        self.cols / QBLOCK
    }

    /// Row groups (the last one maybe padded).
    pub(crate) fn groups(&self) -> usize {
        self.rows.div_ceil(LANES)
    }

    /// Group `g`'s bytes: its group-blocks in order.
    pub(crate) fn group(&self, g: usize) -> &[u8] {
        let n = self.row_blocks() * self.format.group_block_bytes();
        &self.data[g * n..(g + 1) * n]
    }

    /// Row `r`'s codes and scale halves in the file's layout (see [`QuantWeights`]).
    pub fn row_blocks_of(&self, r: usize) -> (Vec<u8>, Vec<u16>) {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        let (nb, l) = (self.row_blocks(), r % LANES);
        let f = self.format;
        let (gbb, codes_at) = (f.group_block_bytes(), f.group_codes_at());
        let (cb, sh, hb) = (f.code_bytes(), f.scale_halves(), f.high_bytes());
        let high_at = f.group_high_at();
        let group = self.group(r / LANES);
        let mut codes = Vec::with_capacity(nb * cb);
        let mut halves = Vec::with_capacity(nb * sh);
        for block in group.chunks_exact(gbb) {
            for h in 0..sh {
                let o = scale_offset(f, l, h);
                halves.push(u16::from_le_bytes([block[o], block[o + 1]]));
            }
            codes.extend_from_slice(&block[high_at + hb * l..high_at + hb * (l + 1)]);
            codes.extend((0..cb - hb).map(|i| block[codes_at + code_offset(l, i)]));
        }
        (codes, halves)
    }

    /// The whole matrix in the file's layout: every row's codes, then every row's halves.
    pub fn to_row_major(&self) -> (Vec<u8>, Vec<u16>) {
        let (mut codes, mut halves) = (Vec::new(), Vec::new());
        for r in 0..self.rows {
            let (c, h) = self.row_blocks_of(r);
            codes.extend(c);
            halves.extend(h);
        }
        (codes, halves)
    }

    /// Row `r` decoded to FP32 into `out` (`cols` values): `d * q + m` per value.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let (codes, halves) = self.row_blocks_of(r);
        let view = QuantWeights::new(self.format, 1, self.cols, &codes, &halves)
            .expect("one row of whole blocks");
        view.dequantize_row(0, out);
    }

    /// Rows `ids`, decoded: `[ids.len(), cols]` (the embedding lookup). Panics on an id
    /// past the last row.
    pub fn gather_rows(&self, ids: &[usize]) -> Vec<f32> {
        let mut out = vec![0.0f32; ids.len() * self.cols];
        for (&r, values) in ids.iter().zip(out.chunks_exact_mut(self.cols.max(1))) {
            self.dequantize_row(r, values);
        }
        out
    }
}

/// A group-block's scales in FP32: `d` and `m` per lane (`m` as in `crate::dot`; K8 and
/// K2: the second half's `d`).
pub(crate) fn group_scales(format: QuantFormat, block: &[u8]) -> ([f32; LANES], [f32; LANES]) {
    let d = group_scale(format, block, 0);
    let m = match format.scales() {
        1 => std::array::from_fn(|l| format.offset(d[l])),
        _ => group_scale(format, block, 1),
    };
    (d, m)
}

/// K2's mins per lane, of the first and the second half (its scales 2 and 3).
pub(crate) fn group_mins(block: &[u8]) -> ([f32; LANES], [f32; LANES]) {
    let f = QuantFormat::K2;
    (group_scale(f, block, 2), group_scale(f, block, 3))
}

/// Scale `s` of a group-block's eight rows in FP32.
fn group_scale(format: QuantFormat, block: &[u8], s: usize) -> [f32; LANES] {
    let sb = format.scale_bytes();
    std::array::from_fn(|l| {
        let at = (s * LANES + l) * sb;
        match sb {
            4 => f32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]),
            _ => f16::from_bits(u16::from_le_bytes([block[at], block[at + 1]])).to_f32(),
        }
    })
}
