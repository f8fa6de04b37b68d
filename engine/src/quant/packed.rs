//! GGUF blocks repacked into the kernels' two word arrays (codes and scales) on the host.
//!
//! The layout is described in `fornax_shaders::quant_matmul`; it takes the same bytes as
//! the file's blocks, give or take one padding half.

use std::borrow::Cow;

use bytemuck::cast_slice;
use half::f16;

use crate::gguf::GgmlType;
use fornax_cpu::SUPER_GROUPS;
use fornax_shaders::quant_matmul::{
    code_shift, code_value, codes_per_word, quant_words, K2, K2_SCALE_WORDS, K4, K5,
    K5_SCALE_WORDS, K8, Q4_0, Q4_1, Q8_0, QBLOCK,
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
    /// Scale words: IEEE halves, or (the K-quants' groups) their steps, one byte each.
    pub scales: Vec<u32>,
    /// The K-quants' super-blocks' `d` and `-dmin` as IEEE halves (empty for the others).
    pub supers: Vec<u16>,
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

/// The CPU kernels' format for `ty`: the legacy blocks as they are, the K-quants as
/// groups of 32 with their super-blocks' scales; `None` for the float types.
pub fn cpu_format(ty: GgmlType) -> Option<fornax_cpu::QuantFormat> {
    use fornax_cpu::QuantFormat as F;
    Some(match ty {
        GgmlType::Q4_0 => F::Q4_0,
        GgmlType::Q4_1 => F::Q4_1,
        GgmlType::Q8_0 => F::Q8_0,
        GgmlType::Q5_0 => F::Q5_0,
        GgmlType::Q5_1 => F::Q5_1,
        GgmlType::Q4_K => F::K4,
        GgmlType::Q5_K => F::K5,
        GgmlType::Q6_K => F::K6,
        GgmlType::Q3_K => F::K3,
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
    /// A legacy block's codes are what follows its halves (Q5_0, Q5_1: `qh`, then the
    /// nibbles); the K-quants become groups of 32 (`PackedMatrix::pack_groups`).
    pub fn pack(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Option<Self> {
        let format = cpu_format(ty)?;
        let block_bytes = ty.block_bytes() as usize;
        let per_block = ty.block_elements() as usize;
        let blocks = rows * cols / per_block;
        if !cols.is_multiple_of(per_block) || bytes.len() != blocks * block_bytes {
            return None;
        }
        if format.super_scales() {
            return Some(Self::pack_groups(ty, format, bytes, rows, cols));
        }
        // Offset of the codes in a block: after d (and m for Q4_1 and Q5_1).
        let codes_at = 2 * format.scales();
        let mut codes = Vec::with_capacity(blocks * (block_bytes - codes_at));
        let mut halves: Vec<u16> = Vec::with_capacity(blocks * 2);
        for block in bytes.chunks_exact(block_bytes) {
            halves.extend(le_halves(&block[..codes_at]));
            codes.extend_from_slice(&block[codes_at..]);
        }
        Some(Self::from_blocks(ty, rows, cols, &codes, &halves, &[]))
    }

    /// A K-quant matrix as the CPU kernels' groups of 32 (`format`: K4, K5, K6, K3 or
    /// K2; see `fornax_cpu::QuantFormat` for their codes), each group's steps (`scale,
    /// min`, K6's and K3's scale per half, K2's scale per half then min per half) as
    /// bytes, two a word, and each super-block's `d` and `-dmin`.
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
        let mut steps: Vec<u8> = Vec::with_capacity(groups * format.block_scale_bytes());
        let mut supers: Vec<u16> = Vec::with_capacity(2 * groups / SUPER_GROUPS);
        for block in bytes.chunks_exact(ty.block_bytes() as usize) {
            supers.extend(ty.super_halves(block).expect("a K-quant"));
            ty.groups(block, |g| {
                let s = g.steps;
                let own = match format {
                    F::K2 => &s[..],
                    F::K8 | F::K6 | F::K3 => &s[..2],
                    _ => &[s[0], s[2]][..],
                };
                steps.extend(own.iter().map(|&v| v as u8));
                // Q6_K's and Q3_K's codes with their offset put back (0..63, 0..7).
                let offset = match format {
                    F::K6 => 32,
                    F::K3 => 4,
                    _ => 0,
                };
                codes.extend(format.encode_codes(&g.q.map(|q| i32::from(q) + offset)));
            });
        }
        let words: Vec<u16> = le_halves(&steps).collect();
        Self::from_blocks(ty, rows, cols, &codes, &words, &supers)
    }

    /// Bytes one row of `cols` values of `ty` takes once packed, the larger of the host's
    /// and the device's (whose K-quant scales are FP32); `None` for a type without kernels.
    pub fn row_bytes(ty: GgmlType, cols: usize) -> Option<usize> {
        let f = cpu_format(ty)?;
        let blocks = cols / QBLOCK;
        let supers = match f.super_scales() {
            true => 4 * blocks / SUPER_GROUPS,
            false => 0,
        };
        let host = blocks * (f.code_bytes() + f.block_scale_bytes()) + supers;
        let device = blocks
            * match format_code(ty) {
                Some(K5) => 4 * (4 + K5_SCALE_WORDS),
                Some(code) if f.super_scales() => {
                    4 * (quant_words(code) + device_scale_words(code))
                }
                _ => 0,
            };
        Some(host.max(device))
    }

    /// The code and scale words as the CubeCL kernels read them: the legacy formats' words
    /// as they are; the K-quants' scales as FP32 words, `d` and `m` (K8: `d` per half; K2:
    /// `d` per half, then `m` per half); Q6_K as K8 (signed bytes); and the 5-bit types
    /// (Q5_0, Q5_1, Q5_K) as Q4's four code words a block and three scale words (FP32 `d`
    /// and `m`, the fifth bits), so code words stay whole vectors of four.
    pub fn device_words(&self) -> (Cow<'_, [u32]>, Cow<'_, [u32]>) {
        let code = self.format();
        let view = self.cpu_view();
        if code != K5 && !view.format().super_scales() {
            return (Cow::Borrowed(&self.quants), Cow::Borrowed(&self.scales));
        }
        let blocks = self.rows * self.cols / QBLOCK;
        let per_row = self.cols / QBLOCK;
        let mut scales = Vec::with_capacity(device_scale_words(code) * blocks);
        let mut quants = Vec::with_capacity(4 * blocks);
        let code_words = view.format().code_bytes() / 4;
        let twin = device_twin(view.format());
        for b in 0..blocks {
            let (d, m) = view.block_scales(b / per_row, b % per_row);
            let words = &self.quants[b * code_words..(b + 1) * code_words];
            if let Some((device, offset)) = twin {
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                let q = view.format().block_codes(&bytes).map(|q| q - offset);
                quants.extend(le_words(&device.encode_codes(&q)));
            }
            match code {
                K5 => {
                    quants.extend_from_slice(&words[1..]);
                    scales.extend([d[0].to_bits(), m[0].to_bits(), words[0]]);
                }
                K8 => scales.extend(d.map(f32::to_bits)),
                K2 => scales.extend(d.into_iter().chain(m).map(f32::to_bits)),
                _ => scales.extend([d[0].to_bits(), m[0].to_bits()]),
            }
        }
        match code == K5 || twin.is_some() {
            true => (Cow::Owned(quants), Cow::Owned(scales)),
            false => (Cow::Borrowed(&self.quants), Cow::Owned(scales)),
        }
    }

    /// The matrix from [`Self::device_words`] (read back from a device): the K-quants'
    /// FP32 scales factored back into steps of an IEEE half per super-block.
    pub fn from_device_words(
        ggml_type: GgmlType,
        rows: usize,
        cols: usize,
        quants: Vec<u32>,
        scales: Vec<u32>,
    ) -> Self {
        let format = cpu_format(ggml_type).expect("packed matrices have a CPU format");
        let code = format_code(ggml_type).expect("packed matrices have a kernel format");
        if code != K5 && !format.super_scales() {
            return Self {
                ggml_type,
                rows,
                cols,
                quants,
                scales,
                supers: Vec::new(),
            };
        }
        let per = device_scale_words(code);
        let value = |w: u32| f32::from_bits(w);
        let mut codes = Vec::with_capacity(4 * quants.len() + 4 * scales.len() / per);
        // Per block: (d, m) for K4 and the 5-bit types, the halves' `d` for K8, then `m`
        // for K2.
        let mut block_scales: Vec<[f32; 4]> = Vec::with_capacity(scales.len() / per);
        let code_words = quant_words(code);
        for (words, s) in quants
            .chunks_exact(code_words)
            .zip(scales.chunks_exact(per))
        {
            if code == K5 {
                codes.extend(s[2].to_le_bytes());
            }
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            match device_twin(format) {
                Some((device, offset)) => {
                    let q = device.block_codes(&bytes).map(|q| q + offset);
                    codes.extend(format.encode_codes(&q));
                }
                None => codes.extend(bytes),
            }
            block_scales.push(match code {
                K2 => [value(s[0]), value(s[1]), value(s[2]), value(s[3])],
                _ => [value(s[0]), value(s[1]), 0.0, 0.0],
            });
        }
        if !format.super_scales() {
            // Q5_0 and Q5_1: their IEEE halves, exact in FP32 and back.
            let halves: Vec<u16> = block_scales
                .iter()
                .flat_map(|s| &s[..format.scales()])
                .map(|&v| f16::from_f32(v).to_bits())
                .collect();
            return Self::from_blocks(ggml_type, rows, cols, &codes, &halves, &[]);
        }
        let mut steps: Vec<u8> =
            Vec::with_capacity(format.block_scale_bytes() * block_scales.len());
        let mut supers = Vec::with_capacity(2 * block_scales.len() / SUPER_GROUPS);
        for sb in block_scales.chunks_exact(SUPER_GROUPS) {
            // Which of a block's four values are scales (times `d`) and which mins.
            let (ds, ms): (&[usize], &[usize]) = match format {
                fornax_cpu::QuantFormat::K2 => (&[0, 1], &[2, 3]),
                fornax_cpu::QuantFormat::K8
                | fornax_cpu::QuantFormat::K6
                | fornax_cpu::QuantFormat::K3 => (&[0, 1], &[]),
                _ => (&[0], &[1]),
            };
            let pick = |at: &[usize]| -> Vec<f32> {
                sb.iter().flat_map(|s| at.iter().map(|&i| s[i])).collect()
            };
            let (d, d_steps) = factor(&pick(ds)).expect("device scales expanded from steps");
            let (dmin, m_steps) = factor(&pick(ms)).expect("device mins expanded from steps");
            supers.extend([d.to_bits(), dmin.to_bits()]);
            for g in 0..SUPER_GROUPS {
                let own_d = &d_steps[g * ds.len()..(g + 1) * ds.len()];
                let own_m = &m_steps[g * ms.len()..(g + 1) * ms.len()];
                steps.extend(own_d.iter().chain(own_m).map(|&v| v as u8));
            }
        }
        let words: Vec<u16> = le_halves(&steps).collect();
        Self::from_blocks(ggml_type, rows, cols, &codes, &words, &supers)
    }

    /// The matrix from its blocks' codes (in the file's order), scale words (Q4_1: `d, m`
    /// per block) and super-block halves, as the CPU kernels' layout gives them back.
    pub fn from_blocks(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        codes: &[u8],
        halves: &[u16],
        supers: &[u16],
    ) -> Self {
        let quants = le_words(codes).collect();
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
            supers: supers.to_vec(),
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
            &self.supers,
        )
        .expect("packed matrices hold whole blocks of their shape")
    }

    /// Bytes of the word arrays.
    pub fn bytes(&self) -> usize {
        4 * (self.quants.len() + self.scales.len()) + 2 * self.supers.len()
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

/// Where the device keeps a CPU format's codes in another format: that format and the
/// offset taken off the codes (Q6_K's and Q3_K's as K8's signed bytes, Q2_K's as Q4's
/// nibbles); `None` where the words are the same.
fn device_twin(format: fornax_cpu::QuantFormat) -> Option<(fornax_cpu::QuantFormat, i32)> {
    use fornax_cpu::QuantFormat as F;
    match format {
        F::K6 => Some((F::K8, 32)),
        F::K3 => Some((F::K8, 4)),
        F::K2 => Some((F::K4, 0)),
        _ => None,
    }
}

/// Bytes as little-endian 16-bit words.
fn le_halves(bytes: &[u8]) -> impl Iterator<Item = u16> + '_ {
    bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
}

/// Bytes as little-endian 32-bit words.
fn le_words(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// FP32 scale words per block on the device for the K-quants' and 5-bit types' codes.
fn device_scale_words(code: u32) -> usize {
    match code {
        K2 => K2_SCALE_WORDS,
        K5 => K5_SCALE_WORDS,
        _ => 2,
    }
}

/// `values` as one IEEE half times signed bytes, exactly (`None` where no such factoring
/// exists): how FP32 scales read back from a device become a super-block's half and its
/// groups' steps again. Any factoring serves, since the products are the same values.
fn factor(values: &[f32]) -> Option<(f16, Vec<i8>)> {
    let top = values.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    if top == 0.0 {
        return Some((f16::ZERO, vec![0; values.len()]));
    }
    // The largest value is `d` times some step of magnitude `k`.
    for k in 1..=128u8 {
        for sign in [1.0f32, -1.0] {
            let d = sign * top / f32::from(k);
            let half = f16::from_f32(d);
            if half.to_f32() != d {
                continue;
            }
            let steps: Option<Vec<i8>> = values
                .iter()
                .map(|&v| {
                    let s = (v / d).round();
                    ((-128.0..=127.0).contains(&s) && d * s == v).then_some(s as i8)
                })
                .collect();
            if let Some(steps) = steps {
                return Some((half, steps));
            }
        }
    }
    None
}
