//! GGUF blocks repacked into the kernels' two word arrays (codes and scales) on the host.
//!
//! The layout is described in `fornax_shaders::quant_matmul`; it takes the same bytes as
//! the file's blocks, give or take one padding half.

use bytemuck::cast_slice;
use half::f16;

use crate::gguf::GgmlType;
use fornax_shaders::quant_matmul::{
    code_shift, code_value, codes_per_word, quant_words, Q4_0, Q4_1, Q8_0, QBLOCK,
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
    /// Scale words (IEEE halves).
    pub scales: Vec<u32>,
}

/// The kernels' format code of a GGUF type, `None` for types they do not read.
pub fn format_code(ty: GgmlType) -> Option<u32> {
    match ty {
        GgmlType::Q4_0 => Some(Q4_0),
        GgmlType::Q4_1 => Some(Q4_1),
        GgmlType::Q8_0 => Some(Q8_0),
        _ => None,
    }
}

/// Whether some backend's kernels read `ty`: the CubeCL kernels' types
/// ([`format_code`]) and Q5_0, which only the CPU kernels read so far.
pub fn packable(ty: GgmlType) -> bool {
    format_code(ty).is_some() || ty == GgmlType::Q5_0
}

impl PackedMatrix {
    /// Repacks the GGUF blocks of a `[rows, cols]` matrix; `None` for a type without
    /// kernels, rows that are not whole blocks, or `bytes` that are not `rows * cols` values.
    /// A block's codes are what follows its halves (Q5_0: `qh`, then the nibbles).
    pub fn pack(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Option<Self> {
        if !packable(ty) {
            return None;
        }
        let block_bytes = ty.block_bytes() as usize;
        let blocks = rows * cols / QBLOCK;
        if !cols.is_multiple_of(QBLOCK) || bytes.len() != blocks * block_bytes {
            return None;
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
        let format = match self.ggml_type {
            GgmlType::Q4_0 => fornax_cpu::QuantFormat::Q4_0,
            GgmlType::Q4_1 => fornax_cpu::QuantFormat::Q4_1,
            GgmlType::Q5_0 => fornax_cpu::QuantFormat::Q5_0,
            _ => fornax_cpu::QuantFormat::Q8_0,
        };
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
        let Some(format) = format_code(self.ggml_type) else {
            // A type only the CPU kernels read: decoded by their view.
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
