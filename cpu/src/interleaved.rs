//! The CPU kernels' weight layout: the file's blocks with eight rows interleaved, so that
//! one SIMD product covers a block of eight rows and its results land one row per lane.
//!
//! Rows are taken in groups of [`LANES`] (the last group padded with zero rows). A group
//! is a run of group-blocks, one per block of 32 columns, then (the K formats) a run of
//! super entries, one per super-block. A group-block holds:
//! - the eight rows' scales, scale after scale, each a run of eight: `d` as IEEE halves,
//!   then (Q4_1, Q5_1) their eight `m`; the K formats' steps as signed bytes (K4, K5: the
//!   scale steps, then the min steps; K8, K6, K3: the first then the second half's; K2:
//!   the halves' scale steps, then their min steps);
//! - (Q5_0, Q5_1, K5, K3; K6) the eight rows' high bytes, row `l`'s byte `i` at
//!   `32 (i / 4) + 4l + i % 4` (one run of 32 bytes; K6: two);
//! - the eight rows' codes in chunks of 32 bytes, row `l`'s byte `i` likewise: chunk `c`
//!   holds 4 bytes of each row, row `l`'s bytes `4c..4c + 4` of its block at `32c + 4l`.
//!   For Q4 that is values `4c..4c + 4` in the low nibbles and `16 + 4c..` in the high
//!   ones; for Q8_0 and K8 values `4c..4c + 4`; K2's and K3's two chunks hold the crumbs
//!   of values below 16, then above.
//!
//! A super entry holds the eight rows' super-block `d` as IEEE halves, then their `-dmin`.
//!
//! It takes the same bytes as the blocks it is made from (plus the padding rows).

use half::f16;

use crate::format::{QuantFormat, QuantWeights, QBLOCK, SUPER_GROUPS};

/// Rows per group: the lanes of one 256-bit vector of FP32.
pub const LANES: usize = 8;

/// Bytes of a super entry: eight rows' `d` and `-dmin` as IEEE halves.
pub(crate) const SUPER_BYTES: usize = 4 * LANES;

/// A `[rows, cols]` block-quantized matrix in the kernels' interleaved layout, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct InterleavedWeights {
    pub(crate) format: QuantFormat,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) data: Vec<u8>,
}

/// A matrix's blocks in the file's order, owned: the arrays a [`QuantWeights`] borrows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowBlocks {
    /// Code bytes.
    pub codes: Vec<u8>,
    /// Scale words.
    pub scales: Vec<u16>,
    /// Super-block halves (the K formats).
    pub supers: Vec<u16>,
}

/// Where row `l`'s scale byte `k` of a block lies in a group-block: scale `s` of the
/// eight rows is a run of eight values.
const fn scale_offset(format: QuantFormat, l: usize, k: usize) -> usize {
    let sb = format.scale_bytes();
    (k / sb * LANES + l) * sb + k % sb
}

/// Where row `l`'s code byte `i` of a block lies among a group-block's codes.
pub(crate) const fn code_offset(l: usize, i: usize) -> usize {
    (i / 4) * 32 + l * 4 + i % 4
}

impl QuantFormat {
    /// Bytes of one group-block: eight rows' scales and codes.
    pub(crate) const fn group_block_bytes(self) -> usize {
        LANES * (self.block_scale_bytes() + self.code_bytes())
    }

    /// Where the high-bit words start in a group-block (Q5_0).
    pub(crate) const fn group_high_at(self) -> usize {
        LANES * self.block_scale_bytes()
    }

    /// Where the codes start in a group-block.
    pub(crate) const fn group_codes_at(self) -> usize {
        self.group_high_at() + LANES * self.high_bytes()
    }

    /// FP32 vectors per block in a group's expanded scales (`crate::dot::expand_scales`):
    /// `d` and `m`, and the two mins of the formats with an offset per half.
    pub(crate) const fn expanded_vectors(self) -> usize {
        match self.half_mins() {
            true => 4,
            false => 2,
        }
    }

    /// Bytes of a group of `nb` blocks a row: its group-blocks and super entries.
    pub(crate) const fn group_bytes(self, nb: usize) -> usize {
        let supers = match self.super_scales() {
            true => nb / SUPER_GROUPS * SUPER_BYTES,
            false => 0,
        };
        nb * self.group_block_bytes() + supers
    }
}

/// Block `b`'s super entry in a group of `nb` blocks a row (empty for the formats
/// without).
#[inline(always)]
pub(crate) fn super_entry(format: QuantFormat, group: &[u8], nb: usize, b: usize) -> &[u8] {
    match format.super_scales() {
        true => {
            let at = nb * format.group_block_bytes() + b / SUPER_GROUPS * SUPER_BYTES;
            &group[at..at + SUPER_BYTES]
        }
        false => &[],
    }
}

impl InterleavedWeights {
    /// The same matrix with its rows interleaved.
    pub fn new(w: &QuantWeights<'_>) -> Self {
        let format = w.format;
        let nb = w.row_blocks();
        let groups = w.rows.div_ceil(LANES);
        let (gbb, codes_at) = (format.group_block_bytes(), format.group_codes_at());
        let (cb, sb, hb) = (
            format.code_bytes(),
            format.block_scale_bytes(),
            format.high_bytes(),
        );
        let (high_at, group_bytes) = (format.group_high_at(), format.group_bytes(nb));
        let mut data = vec![0u8; groups * group_bytes];
        for r in 0..w.rows {
            let (g, l) = (r / LANES, r % LANES);
            let (codes, steps) = (w.row_codes(r), w.row_scale_bytes(r));
            let group = &mut data[g * group_bytes..(g + 1) * group_bytes];
            for b in 0..nb {
                let block = &mut group[b * gbb..(b + 1) * gbb];
                for (k, &byte) in steps[b * sb..(b + 1) * sb].iter().enumerate() {
                    block[scale_offset(format, l, k)] = byte;
                }
                let own = &codes[b * cb..(b + 1) * cb];
                for (i, &byte) in own[..hb].iter().enumerate() {
                    block[high_at + code_offset(l, i)] = byte;
                }
                for (i, &byte) in own[hb..].iter().enumerate() {
                    block[codes_at + code_offset(l, i)] = byte;
                }
            }
            for (s, pair) in w.row_supers(r).chunks_exact(2).enumerate() {
                let at = nb * gbb + s * SUPER_BYTES;
                for (i, half) in pair.iter().enumerate() {
                    let o = at + (i * LANES + l) * 2;
                    group[o..o + 2].copy_from_slice(&half.to_le_bytes());
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

    /// Group `g`'s bytes: its group-blocks in order, then its super entries.
    pub(crate) fn group(&self, g: usize) -> &[u8] {
        let n = self.format.group_bytes(self.row_blocks());
        &self.data[g * n..(g + 1) * n]
    }

    /// Row `r`'s blocks in the file's layout (see [`QuantWeights`]).
    pub fn row_blocks_of(&self, r: usize) -> RowBlocks {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        let (nb, l) = (self.row_blocks(), r % LANES);
        let f = self.format;
        let (gbb, codes_at) = (f.group_block_bytes(), f.group_codes_at());
        let (cb, sb, hb) = (f.code_bytes(), f.block_scale_bytes(), f.high_bytes());
        let high_at = f.group_high_at();
        let group = self.group(r / LANES);
        let mut out = RowBlocks::default();
        for block in group[..nb * gbb].chunks_exact(gbb) {
            let steps: Vec<u8> = (0..sb).map(|k| block[scale_offset(f, l, k)]).collect();
            let words = steps.chunks_exact(2);
            out.scales
                .extend(words.map(|w| u16::from_le_bytes([w[0], w[1]])));
            out.codes
                .extend((0..hb).map(|i| block[high_at + code_offset(l, i)]));
            out.codes
                .extend((0..cb - hb).map(|i| block[codes_at + code_offset(l, i)]));
        }
        for entry in group[nb * gbb..].chunks_exact(SUPER_BYTES) {
            out.supers
                .extend(lane_halves(entry, l).map(|h| h.to_bits()));
        }
        out
    }

    /// The whole matrix in the file's layout: every row's blocks, row after row.
    pub fn to_row_major(&self) -> RowBlocks {
        let mut out = RowBlocks::default();
        for r in 0..self.rows {
            let row = self.row_blocks_of(r);
            out.codes.extend(row.codes);
            out.scales.extend(row.scales);
            out.supers.extend(row.supers);
        }
        out
    }

    /// Row `r` decoded to FP32 into `out` (`cols` values): `d * q + m` per value.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let row = self.row_blocks_of(r);
        let view = QuantWeights::new(
            self.format,
            1,
            self.cols,
            &row.codes,
            &row.scales,
            &row.supers,
        )
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

/// Lane `l`'s `d` and `-dmin` of a super entry.
fn lane_halves(entry: &[u8], l: usize) -> [f16; 2] {
    [0, 1].map(|i| {
        let o = (i * LANES + l) * 2;
        f16::from_bits(u16::from_le_bytes([entry[o], entry[o + 1]]))
    })
}

/// Lane `l`'s scales of a group-block (see [`QuantFormat::block_scales`]), `sup` its
/// super entry (empty for the formats without).
fn lane_scales(format: QuantFormat, block: &[u8], sup: &[u8], l: usize) -> ([f32; 2], [f32; 2]) {
    let mut steps = [0u8; 4];
    for (k, step) in steps[..format.block_scale_bytes()].iter_mut().enumerate() {
        *step = block[scale_offset(format, l, k)];
    }
    let sup = match sup.is_empty() {
        true => [0.0; 2],
        false => lane_halves(sup, l).map(f16::to_f32),
    };
    format.block_scales(&steps, sup)
}

/// Block `b`'s scales per lane in a group of `nb` blocks a row: `d`, `m` and the two mins
/// of the formats with an offset per half (zeros for the others), from `scales` where
/// given (the group's expanded scales, `crate::dot::expand_scales`), else from the
/// group-block.
pub(crate) fn block_lanes(
    format: QuantFormat,
    group: &[u8],
    nb: usize,
    b: usize,
    scales: Option<&[[f32; LANES]]>,
) -> [[f32; LANES]; 4] {
    let k = format.expanded_vectors();
    let mut out = [[0.0; LANES]; 4];
    match scales {
        Some(s) => out[..k].copy_from_slice(&s[k * b..k * (b + 1)]),
        None => {
            let gbb = format.group_block_bytes();
            let block = &group[b * gbb..(b + 1) * gbb];
            let sup = super_entry(format, group, nb, b);
            let lanes: [_; LANES] = std::array::from_fn(|l| lane_scales(format, block, sup, l));
            // `m` as in `crate::dot`: the formats with a scale per half take the second
            // half's `d` there, and (with an offset per half) their mins after.
            out[0] = lanes.map(|(d, _)| d[0]);
            out[1] = lanes.map(|(d, m)| match format.half_scales() {
                true => d[1],
                false => m[0],
            });
            if format.half_mins() {
                out[2] = lanes.map(|(_, m)| m[0]);
                out[3] = lanes.map(|(_, m)| m[1]);
            }
        }
    }
    out
}
