//! GGUF blocks repacked into the kernels' two word arrays (codes and scales) on the host.
//!
//! The layout is described in `fornax_shaders::quant_matmul`; it takes the same bytes as
//! the file's blocks, give or take one padding half.

use std::borrow::Cow;

use bytemuck::cast_slice;
use half::f16;

use crate::gguf::GgmlType;
use fornax_shaders::quant_matmul::{
    code_shift, code_value, codes_per_word, quant_words, K2, K4, K5, K5_SCALE_WORDS, K8, Q4_0,
    Q4_1, Q8_0, QBLOCK,
};

/// A `[rows, cols]` block-quantized matrix in the kernels' layout, on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedMatrix {
    /// The GGUF block type.
    pub ggml_type: GgmlType,
    /// Rows (outputs).
    pub rows: usize,
    /// Values per row, a multiple of 32.
    pub cols: usize,
    /// Code words.
    pub quants: Vec<u32>,
    /// Scale words: IEEE halves, or (the K-quants' groups) FP32 values as two words.
    pub scales: Vec<u32>,
}

/// A 32-bit word (an FP32 scale's bits) as two 16-bit words, low first: how the groups of
/// 32 keep their FP32 scales among the scale halves.
fn word_halves(w: u32) -> [u16; 2] {
    [w as u16, (w >> 16) as u16]
}

/// The kernels' format code of a GGUF type, `None` for types they do not read.
pub fn format_code(ty: GgmlType) -> Option<u32> {
    match ty {
        GgmlType::Q4_0 => Some(Q4_0),
        GgmlType::Q4_1 => Some(Q4_1),
        GgmlType::Q8_0 => Some(Q8_0),
        GgmlType::Q4_K => Some(K4),
        GgmlType::Q6_K | GgmlType::Q3_K => Some(K8),
        GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K => Some(K5),
        GgmlType::Q2_K => Some(K2),
        _ => None,
    }
}

/// The CPU kernels' format for `ty`: the legacy blocks as they are, the K-quants (and
/// Q5_1) as groups of 32 with FP32 scales; `None` for the float types.
pub fn cpu_format(ty: GgmlType) -> Option<fornax_cpu::QuantFormat> {
    use fornax_cpu::QuantFormat as F;
    Some(match ty {
        GgmlType::Q4_0 => F::Q4_0,
        GgmlType::Q4_1 => F::Q4_1,
        GgmlType::Q8_0 => F::Q8_0,
        GgmlType::Q5_0 => F::Q5_0,
        GgmlType::Q4_K => F::K4,
        GgmlType::Q5_K | GgmlType::Q5_1 => F::K5,
        GgmlType::Q6_K | GgmlType::Q3_K => F::K8,
        GgmlType::Q2_K => F::K2,
        _ => return None,
    })
}

/// Whether some backend's kernels read `ty`: the CPU kernels' types ([`cpu_format`]),
/// all of which the CubeCL kernels read too ([`format_code`]).
pub fn packable(ty: GgmlType) -> bool {
    cpu_format(ty).is_some()
}

impl PackedMatrix {
    /// Repacks the GGUF blocks of a `[rows, cols]` matrix; `None` for a type without
    /// kernels, rows that are not whole blocks, or `bytes` that are not `rows * cols` values.
    /// A legacy block's codes are what follows its halves (Q5_0: `qh`, then the nibbles);
    /// the K-quants and Q5_1 become groups of 32 (`PackedMatrix::pack_groups`).
    pub fn pack(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Option<Self> {
        let format = cpu_format(ty)?;
        let block_bytes = ty.block_bytes() as usize;
        let per_block = ty.block_elements() as usize;
        let blocks = rows * cols / per_block;
        if !cols.is_multiple_of(per_block) || bytes.len() != blocks * block_bytes {
            return None;
        }
        if ty.has_groups() {
            return Some(Self::pack_groups(ty, format, bytes, rows, cols));
        }
        // Offset of the codes in a block: after d (and m for Q4_1).
        let codes_at = if ty == GgmlType::Q4_1 { 4 } else { 2 };
        let mut codes = Vec::with_capacity(blocks * (block_bytes - codes_at));
        let mut halves: Vec<u16> = Vec::with_capacity(blocks * 2);
        for block in bytes.chunks_exact(block_bytes) {
            halves.push(u16::from_le_bytes([block[0], block[1]]));
            if ty == GgmlType::Q4_1 {
                halves.push(u16::from_le_bytes([block[2], block[3]]));
            }
            codes.extend_from_slice(&block[codes_at..]);
        }
        if let Some(format) = format_code(ty) {
            debug_assert_eq!(codes.len(), blocks * 4 * quant_words(format));
        }
        Some(Self::from_blocks(ty, rows, cols, &codes, &halves))
    }

    /// A K-quant (or Q5_1) matrix as the CPU kernels' groups of 32 (`format`: K4, K5, K8
    /// or K2): codes as Q4_1's, Q5_0's or signed bytes, and each group's FP32 scales
    /// (`scale, min`, K8's scale per half, K2's scale per half then min per half) as two
    /// 16-bit words each, low first.
    fn pack_groups(
        ty: GgmlType,
        format: fornax_cpu::QuantFormat,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Self {
        use fornax_cpu::QuantFormat as F;
        let groups = rows * cols / QBLOCK;
        let mut codes = Vec::with_capacity(groups * format.code_bytes());
        let mut words: Vec<u16> = Vec::with_capacity(groups * format.scale_halves());
        for block in bytes.chunks_exact(ty.block_bytes() as usize) {
            ty.groups(block, |g| {
                let u = |j: usize| g.q[j] as u8;
                let scales = match format {
                    F::K2 => &[g.scale[0], g.scale[1], g.min[0], g.min[1]][..],
                    F::K8 => &g.scale[..],
                    _ => &[g.scale[0], g.min[0]][..],
                };
                debug_assert!(
                    matches!(format, F::K8 | F::K2)
                        || (g.scale[0], g.min[0]) == (g.scale[1], g.min[1])
                );
                match format {
                    F::K8 => codes.extend((0..32).map(u)),
                    _ => {
                        if format == F::K5 {
                            let qh = (0..32).fold(0u32, |w, j| w | u32::from(u(j) >> 4 & 1) << j);
                            codes.extend(qh.to_le_bytes());
                        }
                        codes.extend((0..16).map(|j| u(j) & 15 | (u(j + 16) & 15) << 4));
                    }
                }
                for v in scales {
                    words.extend(word_halves(v.to_bits()));
                }
            });
        }
        Self::from_blocks(ty, rows, cols, &codes, &words)
    }

    /// Bytes one row of `cols` values of `ty` takes once packed (the K-quants' groups are
    /// wider than the file's super-blocks); `None` for a type without kernels.
    pub fn row_bytes(ty: GgmlType, cols: usize) -> Option<usize> {
        let f = cpu_format(ty)?;
        let host = f.code_bytes() + 2 * f.scale_halves();
        // K5 on the device: four code words and three scale words a block.
        let device = match format_code(ty) {
            Some(K5) => 4 * (4 + K5_SCALE_WORDS),
            _ => 0,
        };
        Some(cols / QBLOCK * host.max(device))
    }

    /// The code and scale words as the CubeCL kernels read them: the same words, but K5's
    /// (Q5_0, Q5_1, Q5_K) as Q4's four code words a block and three scale words (FP32 `d`
    /// and `m`, the fifth bits), so code words stay whole vectors of four.
    pub fn device_words(&self) -> (Cow<'_, [u32]>, Cow<'_, [u32]>) {
        if format_code(self.ggml_type) != Some(K5) {
            return (Cow::Borrowed(&self.quants), Cow::Borrowed(&self.scales));
        }
        let blocks = self.rows * self.cols / QBLOCK;
        let mut quants = Vec::with_capacity(4 * blocks);
        let mut scales = Vec::with_capacity(K5_SCALE_WORDS * blocks);
        for (b, words) in self.quants.chunks_exact(5).enumerate() {
            let (d, m) = self.k5_scales(b);
            quants.extend_from_slice(&words[1..]);
            scales.extend([d.to_bits(), m.to_bits(), words[0]]);
        }
        (Cow::Owned(quants), Cow::Owned(scales))
    }

    /// Block `b`'s `d` and `m` (K5's types): Q5_0's half `d` with `m = -16 d` (exact in
    /// FP32), else the two FP32 words.
    fn k5_scales(&self, b: usize) -> (f32, f32) {
        if self.ggml_type == GgmlType::Q5_0 {
            let halves: &[u16] = cast_slice(&self.scales);
            let d = f16::from_bits(halves[b]).to_f32();
            return (d, -16.0 * d);
        }
        let w = &self.scales[2 * b..2 * b + 2];
        (f32::from_bits(w[0]), f32::from_bits(w[1]))
    }

    /// The matrix from [`Self::device_words`] (read back from a device).
    pub fn from_device_words(
        ggml_type: GgmlType,
        rows: usize,
        cols: usize,
        quants: Vec<u32>,
        scales: Vec<u32>,
    ) -> Self {
        if format_code(ggml_type) != Some(K5) {
            return Self {
                ggml_type,
                rows,
                cols,
                quants,
                scales,
            };
        }
        let mut codes = Vec::with_capacity(5 * quants.len());
        let mut halves: Vec<u16> = Vec::new();
        for (words, s) in quants
            .chunks_exact(4)
            .zip(scales.chunks_exact(K5_SCALE_WORDS))
        {
            codes.extend(s[2].to_le_bytes());
            codes.extend(words.iter().flat_map(|w| w.to_le_bytes()));
            match ggml_type {
                GgmlType::Q5_0 => halves.push(f16::from_f32(f32::from_bits(s[0])).to_bits()),
                _ => halves.extend([s[0], s[1]].into_iter().flat_map(word_halves)),
            }
        }
        Self::from_blocks(ggml_type, rows, cols, &codes, &halves)
    }

    /// The matrix from its blocks' codes (in the file's order) and scale halves (Q4_1:
    /// `d, m` per block), as the CPU kernels' layout gives them back.
    pub fn from_blocks(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        codes: &[u8],
        halves: &[u16],
    ) -> Self {
        let quants = codes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut halves = halves.to_vec();
        if halves.len() % 2 == 1 {
            halves.push(0);
        }
        Self {
            ggml_type: ty,
            rows,
            cols,
            quants,
            scales: cast_slice::<u16, u32>(&halves).to_vec(),
        }
    }

    /// The kernels' format code.
    pub fn format(&self) -> u32 {
        format_code(self.ggml_type).expect("packed matrices have a kernel format")
    }

    /// The CPU kernels' view of the same words.
    pub fn cpu_view(&self) -> fornax_cpu::QuantWeights<'_> {
        let format = cpu_format(self.ggml_type).expect("packed matrices have a CPU format");
        fornax_cpu::QuantWeights::new(
            format,
            self.rows,
            self.cols,
            cast_slice(&self.quants),
            cast_slice(&self.scales),
        )
        .expect("packed matrices hold whole blocks of their shape")
    }

    /// Bytes of the two word arrays.
    pub fn bytes(&self) -> usize {
        4 * (self.quants.len() + self.scales.len())
    }

    /// All values as `[rows, cols]` FP32, decoded from the packed words (the reference).
    pub fn dequantize(&self) -> Vec<f32> {
        let Some(format) = format_code(self.ggml_type).filter(|&f| f <= Q8_0) else {
            // The groups of 32 and the types only the CPU kernels read: decoded by their
            // view of the same words.
            let view = self.cpu_view();
            let mut out = vec![0.0f32; self.rows * self.cols];
            for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
                view.dequantize_row(r, row);
            }
            return out;
        };
        let words = quant_words(format);
        let halves: &[u16] = cast_slice(&self.scales);
        let half = |i: usize| f16::from_bits(halves[i]).to_f32();
        let mut out = vec![0.0f32; self.rows * self.cols];
        for (block, values) in out.chunks_exact_mut(QBLOCK).enumerate() {
            let (d, m) = match format {
                Q4_1 => (half(2 * block), half(2 * block + 1)),
                Q4_0 => (half(block), -8.0 * half(block)),
                _ => (half(block), 0.0),
            };
            for w in 0..words {
                let word = self.quants[block * words + w];
                for p in 0..codes_per_word(format) {
                    let bits = word >> code_shift(format, p);
                    let q = match format {
                        Q8_0 => f32::from((bits & 255) as u8 as i8),
                        _ => (bits & 15) as f32,
                    };
                    values[code_value(format, w, p)] = d * q + m;
                }
            }
        }
        out
    }
}
