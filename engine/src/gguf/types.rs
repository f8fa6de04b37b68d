//! Tensor element types (ggml types) that Fornax can read.

use half::{bf16, f16};

/// A tensor storage type from the GGUF tensor table (named as ggml names them).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
}

/// Values per K-quant super-block.
pub const QK_K: usize = 256;

/// Every readable type with its GGUF id (ggml's `ggml_type` numbering).
const IDS: [(GgmlType, u32); 13] = [
    (GgmlType::F32, 0),
    (GgmlType::F16, 1),
    (GgmlType::Q4_0, 2),
    (GgmlType::Q4_1, 3),
    (GgmlType::Q5_0, 6),
    (GgmlType::Q5_1, 7),
    (GgmlType::Q8_0, 8),
    (GgmlType::Q2_K, 10),
    (GgmlType::Q3_K, 11),
    (GgmlType::Q4_K, 12),
    (GgmlType::Q5_K, 13),
    (GgmlType::Q6_K, 14),
    (GgmlType::BF16, 30),
];

impl GgmlType {
    /// Maps the numeric id used in GGUF files; `None` for types Fornax cannot read.
    pub fn from_id(id: u32) -> Option<Self> {
        IDS.iter().find(|(_, i)| *i == id).map(|(t, _)| *t)
    }

    /// The numeric id GGUF files use for this type.
    pub fn id(self) -> u32 {
        IDS.iter()
            .find(|(t, _)| *t == self)
            .map(|(_, i)| *i)
            .expect("every type has an id")
    }

    /// Every type Fornax reads.
    pub fn all() -> impl Iterator<Item = Self> {
        IDS.iter().map(|(t, _)| *t)
    }

    /// The names of every type Fornax reads, comma-separated.
    pub fn names() -> String {
        Self::all().map(Self::name).collect::<Vec<_>>().join(", ")
    }

    /// Its name as ggml and llama.cpp write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q2_K => "Q2_K",
            Self::Q3_K => "Q3_K",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
        }
    }

    /// Elements per block (1 for plain float types).
    pub fn block_elements(self) -> u64 {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 => 32,
            Self::Q2_K | Self::Q3_K | Self::Q4_K | Self::Q5_K | Self::Q6_K => QK_K as u64,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            // scales and mins (16), 2-bit codes (64), d and dmin.
            Self::Q2_K => 84,
            // high-bit mask (32), 2-bit codes (64), 6-bit scales (12), d.
            Self::Q3_K => 110,
            // d and dmin, 6-bit scales and mins (12), 4-bit codes (128).
            Self::Q4_K => 144,
            // as Q4_K plus the fifth bits (32).
            Self::Q5_K => 176,
            // low 4 bits (128), high 2 bits (64), 8-bit scales (16), d.
            Self::Q6_K => 210,
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
            Self::F16 => blocks.for_each(|(b, o)| o[0] = half(b, 0)),
            Self::BF16 => {
                blocks.for_each(|(b, o)| o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32())
            }
            Self::Q8_0 => blocks.for_each(|(b, o)| {
                let d = half(b, 0);
                for (v, &q) in o.iter_mut().zip(&b[2..34]) {
                    *v = d * f32::from(q as i8);
                }
            }),
            Self::Q4_0 => blocks.for_each(|(b, o)| {
                let d = half(b, 0);
                for (j, &q) in b[2..18].iter().enumerate() {
                    o[j] = d * (f32::from(q & 0x0f) - 8.0);
                    o[j + 16] = d * (f32::from(q >> 4) - 8.0);
                }
            }),
            Self::Q4_1 => blocks.for_each(|(b, o)| {
                let (d, m) = (half(b, 0), half(b, 2));
                for (j, &q) in b[4..20].iter().enumerate() {
                    o[j] = d * f32::from(q & 0x0f) + m;
                    o[j + 16] = d * f32::from(q >> 4) + m;
                }
            }),
            Self::Q5_0 => blocks.for_each(|(b, o)| {
                let d = half(b, 0);
                fifth_bits(&b[2..6], &b[6..22], o, |q| d * (q - 16.0));
            }),
            Self::Q5_1 | Self::Q2_K | Self::Q3_K | Self::Q4_K | Self::Q5_K | Self::Q6_K => blocks
                .for_each(|(b, o)| {
                    let mut values = o.chunks_exact_mut(32);
                    self.groups(b, |g| {
                        let out = values.next().expect("a block's groups fill it");
                        for (j, v) in out.iter_mut().enumerate() {
                            *v = g.value(j);
                        }
                    });
                }),
        }
    }
}

impl GgmlType {
    /// `bytes` (whole blocks of this type) as Q8_0 blocks of the same values, where that
    /// is exact: Q4_0's and Q5_0's codes less their offset fit a signed byte under the
    /// same scale. `None` for the other types.
    pub fn widened_to_q8_0(self, bytes: &[u8]) -> Option<Vec<u8>> {
        let b_bytes = self.block_bytes() as usize;
        let mut out = Vec::with_capacity(bytes.len() / b_bytes * 34);
        let mut codes = [0.0f32; 32];
        for b in bytes.chunks_exact(b_bytes) {
            match self {
                Self::Q8_0 => codes
                    .iter_mut()
                    .zip(&b[2..34])
                    .for_each(|(c, &q)| *c = f32::from(q as i8)),
                Self::Q4_0 => {
                    for (j, &q) in b[2..18].iter().enumerate() {
                        codes[j] = f32::from(q & 0x0f) - 8.0;
                        codes[j + 16] = f32::from(q >> 4) - 8.0;
                    }
                }
                Self::Q5_0 => fifth_bits(&b[2..6], &b[6..22], &mut codes, |q| q - 16.0),
                _ => return None,
            }
            out.extend_from_slice(&b[..2]);
            out.extend(codes.iter().map(|&c| c as i8 as u8));
        }
        Some(out)
    }
}

/// The IEEE half at byte `at` of `b`.
pub(super) fn half(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Q5_0 codes: value `j < 16` is the low nibble of `low[j]`, value `j + 16` its high
/// nibble, and bit `j` of the little-endian word `high` is value `j`'s fifth bit.
fn fifth_bits(high: &[u8], low: &[u8], o: &mut [f32], value: impl Fn(f32) -> f32) {
    let high = u32::from_le_bytes([high[0], high[1], high[2], high[3]]);
    for (j, &q) in low.iter().enumerate() {
        let lo = u32::from(q & 0x0f) | ((high >> j) & 1) << 4;
        let hi = u32::from(q >> 4) | ((high >> (j + 16)) & 1) << 4;
        o[j] = value(lo as f32);
        o[j + 16] = value(hi as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q4_0 and Q5_0 blocks widened to Q8_0 decode to exactly the same values; the
    /// types with a minimum or super-blocks are refused.
    #[test]
    fn q4_0_and_q5_0_widen_to_q8_0_exactly() {
        let mut state = 7u32;
        let mut byte = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 24) as u8
        };
        for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0] {
            let mut bytes = Vec::new();
            for block in 0..6 {
                let d = f16::from_f32(0.01 + block as f32 * 0.37);
                bytes.extend(d.to_le_bytes());
                bytes.extend((2..ty.block_bytes()).map(|_| byte()));
            }
            let wide = ty.widened_to_q8_0(&bytes).expect("widens");
            let (mut want, mut got) = ([0.0f32; 192], [0.0f32; 192]);
            ty.dequantize(&bytes, &mut want);
            GgmlType::Q8_0.dequantize(&wide, &mut got);
            assert_eq!(got, want, "{ty:?}");
        }
        assert!(GgmlType::Q4_1.widened_to_q8_0(&[0; 20]).is_none());
        assert!(GgmlType::Q4_K.widened_to_q8_0(&[0; 144]).is_none());
    }

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

    /// Every block format against llama.cpp's Python reader (`gguf`), on random blocks
    /// made by `scripts/kquant-reference.py`.
    #[test]
    fn block_formats_decode_as_llama_cpp_does() {
        #[derive(serde::Deserialize)]
        struct Format {
            r#type: String,
            bytes: String,
            values: Vec<f32>,
        }
        #[derive(serde::Deserialize)]
        struct Reference {
            formats: Vec<Format>,
        }
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/reference/quant_blocks.json"
        );
        let text = std::fs::read_to_string(path).expect("the reference file");
        let reference: Reference = serde_json::from_str(&text).expect("valid JSON");
        let mut seen = Vec::new();
        for f in &reference.formats {
            let ty = GgmlType::all()
                .find(|t| t.name() == f.r#type)
                .unwrap_or_else(|| panic!("unknown type {}", f.r#type));
            let bytes: Vec<u8> = (0..f.bytes.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&f.bytes[i..i + 2], 16).unwrap())
                .collect();
            let elements = bytes.len() as u64 / ty.block_bytes() * ty.block_elements();
            assert_eq!(elements as usize, f.values.len(), "{}", f.r#type);
            let mut out = vec![0.0f32; f.values.len()];
            ty.dequantize(&bytes, &mut out);
            for (i, (a, b)) in out.iter().zip(&f.values).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                    "{} value {i}: {a} against {b}",
                    f.r#type
                );
            }
            seen.push(ty);
        }
        // Every quantized type is covered.
        for ty in GgmlType::all().filter(|t| t.block_elements() > 1) {
            assert!(seen.contains(&ty), "{} has no reference blocks", ty.name());
        }
    }

    #[test]
    fn ids_round_trip() {
        for ty in GgmlType::all() {
            assert_eq!(GgmlType::from_id(ty.id()), Some(ty));
        }
        assert_eq!(GgmlType::from_id(12), Some(GgmlType::Q4_K));
        assert_eq!(GgmlType::from_id(9), None, "Q8_1 is an activation format");
    }

    #[test]
    fn partial_blocks_are_rejected() {
        assert_eq!(GgmlType::Q4_1.bytes_for(64), Some(40));
        assert_eq!(GgmlType::Q4_1.bytes_for(33), None);
        assert_eq!(GgmlType::F16.bytes_for(3), Some(6));
    }
}
