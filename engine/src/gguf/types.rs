//! Tensor element types (ggml types) that Fornax can read.

use half::{bf16, f16};

/// A tensor storage type from the GGUF tensor table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q8_0,
}

impl GgmlType {
    /// Maps the numeric id used in GGUF files; `None` for types Fornax cannot read.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            8 => Self::Q8_0,
            30 => Self::BF16,
            _ => return None,
        })
    }

    /// Elements per block (1 for plain float types).
    pub fn block_elements(self) -> u64 {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q8_0 => 32,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q8_0 => 34,
        }
    }

    /// Bytes taken by `elements` values, `None` if it is not a whole number of blocks.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        let block = self.block_elements();
        elements
            .is_multiple_of(block)
            .then(|| elements / block * self.block_bytes())
    }

    /// Decodes `bytes` (a whole number of blocks) into `out`, which must hold the elements.
    pub fn dequantize(self, bytes: &[u8], out: &mut [f32]) {
        let n_block = self.block_elements() as usize;
        let b_bytes = self.block_bytes() as usize;
        debug_assert_eq!(bytes.len() / b_bytes * n_block, out.len());
        let blocks = bytes
            .chunks_exact(b_bytes)
            .zip(out.chunks_exact_mut(n_block));
        match self {
            Self::F32 => {
                blocks.for_each(|(b, o)| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            Self::F16 => blocks.for_each(|(b, o)| o[0] = f16::from_le_bytes([b[0], b[1]]).to_f32()),
            Self::BF16 => {
                blocks.for_each(|(b, o)| o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32())
            }
            Self::Q8_0 => blocks.for_each(|(b, o)| {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                for (v, &q) in o.iter_mut().zip(&b[2..34]) {
                    *v = d * f32::from(q as i8);
                }
            }),
            Self::Q4_0 => blocks.for_each(|(b, o)| {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                for (j, &q) in b[2..18].iter().enumerate() {
                    o[j] = d * (f32::from(q & 0x0f) - 8.0);
                    o[j + 16] = d * (f32::from(q >> 4) - 8.0);
                }
            }),
            Self::Q4_1 => blocks.for_each(|(b, o)| {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                let m = f16::from_le_bytes([b[2], b[3]]).to_f32();
                for (j, &q) in b[4..20].iter().enumerate() {
                    o[j] = d * f32::from(q & 0x0f) + m;
                    o[j + 16] = d * f32::from(q >> 4) + m;
                }
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_1_block_decodes_low_then_high_nibbles() {
        let mut block = vec![];
        block.extend(f16::from_f32(0.5).to_le_bytes());
        block.extend(f16::from_f32(-1.0).to_le_bytes());
        block.extend((0u8..16).map(|j| j | (15 - j) << 4));
        let mut out = [0.0; 32];
        GgmlType::Q4_1.dequantize(&block, &mut out);
        assert_eq!(out[0], -1.0);
        assert_eq!(out[3], 0.5 * 3.0 - 1.0);
        assert_eq!(out[16], 0.5 * 15.0 - 1.0);
        assert_eq!(out[31], -1.0);
    }

    #[test]
    fn q4_0_and_q8_0_are_signed() {
        let mut b = f16::from_f32(2.0).to_le_bytes().to_vec();
        b.extend([0x80u8; 16]);
        let mut out = [0.0; 32];
        GgmlType::Q4_0.dequantize(&b, &mut out);
        assert_eq!((out[0], out[16]), (-16.0, 0.0));

        let mut b = f16::from_f32(0.25).to_le_bytes().to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        GgmlType::Q8_0.dequantize(&b, &mut out);
        assert_eq!((out[0], out[31]), (-4.0, 3.75));
    }

    #[test]
    fn half_precision_floats_decode() {
        let mut out = [0.0; 2];
        let f16s: Vec<u8> = [1.5f32, -65504.0]
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect();
        GgmlType::F16.dequantize(&f16s, &mut out);
        assert_eq!(out, [1.5, -65504.0]);
        let bf16s: Vec<u8> = [3.0e38f32, -0.15625]
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect();
        GgmlType::BF16.dequantize(&bf16s, &mut out);
        assert_eq!(out, [bf16::from_f32(3.0e38).to_f32(), -0.15625]);
        assert!(out[0] > 2.9e38);
    }

    #[test]
    fn partial_blocks_are_rejected() {
        assert_eq!(GgmlType::Q4_1.bytes_for(64), Some(40));
        assert_eq!(GgmlType::Q4_1.bytes_for(33), None);
        assert_eq!(GgmlType::F16.bytes_for(3), Some(6));
    }
}
