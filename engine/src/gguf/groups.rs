//! The K-quants (and Q5_1) as groups of 32 values, `scale * q + min` with one scale and
//! min per half of 16: the reader's dequantization of them, and the form the kernels take
//! them in. Each scale and min is the file's super-block scale times the group's small
//! integer ("step"), exact in FP32.

use super::types::half;
use super::GgmlType;

/// 32 values of a quantized block: value `j` is `scale[j / 16] * q[j] + min[j / 16]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Group {
    /// The integer codes (unsigned codes as they are, Q3_K's and Q6_K's with their offset
    /// taken off).
    pub q: [i8; 32],
    /// The scale of each half.
    pub scale: [f32; 2],
    /// What each half adds (0 where the format has no min).
    pub min: [f32; 2],
    /// The K-quants' small integers behind `scale` and `min`, `[scale_0, scale_1, min_0,
    /// min_1]`: `scale[h] = d * steps[h]` and `min[h] = -dmin * steps[2 + h]`, with `d`
    /// and `dmin` the super-block's ([`GgmlType::super_halves`]). Zero for Q5_1.
    pub steps: [i8; 4],
}

impl Group {
    /// Value `j`.
    pub fn value(&self, j: usize) -> f32 {
        self.scale[j / 16] * f32::from(self.q[j]) + self.min[j / 16]
    }
}

impl GgmlType {
    /// Whether [`GgmlType::groups`] reads this type.
    pub fn has_groups(self) -> bool {
        matches!(
            self,
            Self::Q2_K | Self::Q3_K | Self::Q4_K | Self::Q5_K | Self::Q6_K | Self::Q5_1
        )
    }

    /// A K-quant super-block's `d` and `-dmin` as IEEE halves (`-dmin` is 0 for Q3_K and
    /// Q6_K, which have none); `None` for the other types.
    pub fn super_halves(self, b: &[u8]) -> Option<[u16; 2]> {
        let bits = |at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
        // Negating an IEEE half flips its sign bit, exactly.
        Some(match self {
            Self::Q2_K => [bits(80), bits(82) ^ 0x8000],
            Self::Q3_K => [bits(108), 0],
            Self::Q4_K | Self::Q5_K => [bits(0), bits(2) ^ 0x8000],
            Self::Q6_K => [bits(208), 0],
            _ => return None,
        })
    }

    /// Calls `f` with each group of 32 of block `b`, in order (eight for a K-quant, one
    /// for Q5_1). Panics for a type without groups ([`GgmlType::has_groups`]).
    pub fn groups(self, b: &[u8], mut f: impl FnMut(Group)) {
        match self {
            Self::Q2_K => q2_k(b, f),
            Self::Q3_K => q3_k(b, f),
            Self::Q4_K => q45_k(b, &b[16..144], None, f),
            Self::Q5_K => q45_k(b, &b[48..176], Some(&b[16..48]), f),
            Self::Q6_K => q6_k(b, f),
            Self::Q5_1 => {
                let high = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                let q = std::array::from_fn(|j| {
                    let nibble = if j < 16 {
                        b[8 + j] & 15
                    } else {
                        b[8 + j - 16] >> 4
                    };
                    (nibble | (((high >> j) & 1) as u8) << 4) as i8
                });
                let (d, m) = (half(b, 0), half(b, 2));
                f(Group {
                    q,
                    scale: [d; 2],
                    min: [m; 2],
                    steps: [0; 4],
                })
            }
            _ => panic!("{} has no groups of 32", self.name()),
        }
    }
}

/// Q2_K: sixteen halves of 16 values, each `d * scale * q - dmin * min` with a 4-bit scale
/// (low nibble) and min (high nibble). Codes: each 32-byte half of `qs` holds 128 values,
/// four 2-bit planes of 32 (plane `p` at bits `2p`).
fn q2_k(b: &[u8], mut f: impl FnMut(Group)) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (half(b, 80), half(b, 82));
    for g in 0..8 {
        let (half_block, plane) = (g / 4, g % 4);
        let q = std::array::from_fn(|l| ((qs[half_block * 32 + l] >> (2 * plane)) & 3) as i8);
        let sc = |h: usize| scales[2 * g + h];
        let steps = [sc(0) & 15, sc(1) & 15, sc(0) >> 4, sc(1) >> 4].map(|s| s as i8);
        f(Group {
            q,
            scale: [0, 1].map(|h| d * f32::from(steps[h])),
            min: [0, 1].map(|h| -(dmin * f32::from(steps[2 + h]))),
            steps,
        });
    }
}

/// Q3_K: sixteen halves of 16 values, each `d * (scale - 32) * (q - 4 * !high)`: 2-bit
/// codes laid out as Q2_K's, a third bit per value in `hmask` (bit `i / 32` of byte
/// `i % 32`, set meaning no offset), and 6-bit scales (low nibbles in bytes 0-7, scales
/// 8-15 in their high nibbles; the top two bits of scale `s` at bits `2 (s / 4)` of byte
/// `8 + s % 4`).
fn q3_k(b: &[u8], mut f: impl FnMut(Group)) {
    let (hmask, qs, packed) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = half(b, 108);
    let scale = |s: usize| {
        let low = if s < 8 {
            packed[s] & 0x0f
        } else {
            packed[s - 8] >> 4
        };
        let top = (packed[8 + s % 4] >> (2 * (s / 4))) & 3;
        (low | top << 4) as i8 - 32
    };
    for g in 0..8 {
        let (half_block, plane) = (g / 4, g % 4);
        let q = std::array::from_fn(|l| {
            let q = ((qs[half_block * 32 + l] >> (2 * plane)) & 3) as i8;
            let high = hmask[l] >> g & 1;
            q - if high == 1 { 0 } else { 4 }
        });
        let steps = [scale(2 * g), scale(2 * g + 1), 0, 0];
        f(Group {
            q,
            scale: [0, 1].map(|h| d * f32::from(steps[h])),
            min: [0.0; 2],
            steps,
        });
    }
}

/// Scale and min `j` (of eight, 6 bits each) packed in the 12 bytes Q4_K and Q5_K share:
/// `j < 4` in the low 6 bits of bytes `j` (scale) and `j + 4` (min); the others' low
/// 4 bits in byte `j + 4` (scale low nibble, min high nibble) and their top 2 bits in the
/// top bits of bytes `j - 4` (scale) and `j` (min).
fn scale_min_k4(packed: &[u8], j: usize) -> (i8, i8) {
    let (sc, m) = if j < 4 {
        (packed[j] & 63, packed[j + 4] & 63)
    } else {
        (
            (packed[j + 4] & 0x0f) | (packed[j - 4] >> 6) << 4,
            (packed[j + 4] >> 4) | (packed[j] >> 6) << 4,
        )
    };
    (sc as i8, m as i8)
}

/// Q4_K (and Q5_K, with `qh`): eight groups of 32 values, each `d * scale * q - dmin * min`.
/// Each 32-byte run of codes holds two groups, the low nibbles the first and the high
/// nibbles the second; Q5_K's fifth bit of value `i` is bit `group` of byte `i % 32` of `qh`.
fn q45_k(b: &[u8], qs: &[u8], qh: Option<&[u8]>, mut f: impl FnMut(Group)) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let packed = &b[4..16];
    for g in 0..8 {
        let q = std::array::from_fn(|l| {
            let byte = qs[g / 2 * 32 + l];
            let low = if g % 2 == 0 { byte & 0x0f } else { byte >> 4 };
            let high = qh.map_or(0, |qh| (qh[l] >> g) & 1);
            (low | high << 4) as i8
        });
        let (sc, m) = scale_min_k4(packed, g);
        f(Group {
            q,
            scale: [d * f32::from(sc); 2],
            min: [-(dmin * f32::from(m)); 2],
            steps: [sc, sc, m, m],
        });
    }
}

/// Q6_K: sixteen halves of 16 values, each `d * scale * (q - 32)` with a signed 8-bit
/// scale. Per 128 values, `ql` holds 64 bytes (values `l` and `l + 64` in the low and high
/// nibbles of byte `l`, `l < 64`) and `qh` 32 (the top 2 bits of values `l`, `l + 32`,
/// `l + 64`, `l + 96` at bits 0, 2, 4, 6 of byte `l`, `l < 32`).
fn q6_k(b: &[u8], mut f: impl FnMut(Group)) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = half(b, 208);
    for g in 0..8 {
        let (n, quarter) = (g / 4, g % 4);
        let q = std::array::from_fn(|l| {
            let byte = ql[n * 64 + (quarter % 2) * 32 + l];
            let low = if quarter < 2 { byte & 0x0f } else { byte >> 4 };
            let top = (qh[n * 32 + l] >> (2 * quarter)) & 3;
            (low | top << 4) as i8 - 32
        });
        let steps = [scales[2 * g] as i8, scales[2 * g + 1] as i8, 0, 0];
        f(Group {
            q,
            scale: [0, 1].map(|h| d * f32::from(steps[h])),
            min: [0.0; 2],
            steps,
        });
    }
}
