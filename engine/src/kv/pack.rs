//! Host-side packing of one (block, head) of keys or values into the FP16 and INT8 tiers,
//! in the word layout the kernels read (see `fornax_shaders::paged_attention`).

use half::f16;

/// Largest magnitude the FP16 tier stores after scaling (a power of two below 65504,
/// so rounding up cannot reach infinity).
pub const F16_LIMIT: f32 = 32768.0;

/// The power-of-two scale that brings every value of `values` within [`F16_LIMIT`]:
/// 1 for ordinary activations, so the tier is then exactly FP16; larger only for blocks
/// with outliers beyond FP16's range, whose relative error stays that of FP16.
pub fn f16_scale(values: &[f32]) -> f32 {
    let max = max_abs(values);
    if max <= F16_LIMIT {
        return 1.0;
    }
    let exp = (max / F16_LIMIT).log2().ceil() as i32;
    let mut scale = 2f32.powi(exp);
    while max / scale > F16_LIMIT {
        scale *= 2.0;
    }
    scale
}

/// Packs `values` (even length) divided by `scale` as halves, two per word, the even
/// index in the low 16 bits.
pub fn encode_f16(values: &[f32], scale: f32) -> Vec<u32> {
    values
        .chunks_exact(2)
        .map(|p| {
            let lo = f16::from_f32(p[0] / scale).to_bits() as u32;
            let hi = f16::from_f32(p[1] / scale).to_bits() as u32;
            lo | hi << 16
        })
        .collect()
}

/// Inverse of [`encode_f16`].
pub fn decode_f16(words: &[u32], scale: f32) -> Vec<f32> {
    words
        .iter()
        .flat_map(|&w| [w & 0xffff, w >> 16])
        .map(|h| f16::from_bits(h as u16).to_f32() * scale)
        .collect()
}

/// The INT8 scale of `values`: the largest magnitude maps to 127.
pub fn i8_scale(values: &[f32]) -> f32 {
    let max = max_abs(values);
    if max > 0.0 {
        max / 127.0
    } else {
        1.0
    }
}

/// Packs `values` (length a multiple of 4) divided by `scale`, rounded to signed bytes,
/// four per word, index `4w + b` in byte `b`.
pub fn encode_i8(values: &[f32], scale: f32) -> Vec<u32> {
    values
        .chunks_exact(4)
        .map(|q| {
            q.iter().enumerate().fold(0u32, |word, (b, &v)| {
                let byte = (v / scale).round().clamp(-127.0, 127.0) as i8 as u8;
                word | (byte as u32) << (8 * b)
            })
        })
        .collect()
}

/// Inverse of [`encode_i8`].
pub fn decode_i8(words: &[u32], scale: f32) -> Vec<f32> {
    words
        .iter()
        .flat_map(|&w| (0..4).map(move |b| ((w >> (8 * b)) & 0xff) as u8 as i8))
        .map(|q| q as f32 * scale)
        .collect()
}

fn max_abs(values: &[f32]) -> f32 {
    values.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_values_are_plain_fp16() {
        let v: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.37).collect();
        assert_eq!(f16_scale(&v), 1.0);
        let back = decode_f16(&encode_f16(&v, 1.0), 1.0);
        for (a, b) in v.iter().zip(&back) {
            assert_eq!(*b, f16::from_f32(*a).to_f32());
        }
    }

    /// The error compensation: a block with values far beyond FP16's 65504 keeps FP16's
    /// relative error instead of turning into infinities.
    #[test]
    fn values_beyond_fp16_range_keep_their_relative_error() {
        let mut v: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 1234.5).collect();
        v[7] = 1.0e6;
        v[9] = -3.0e5;
        let scale = f16_scale(&v);
        assert!(scale > 1.0 && (scale.log2().fract() == 0.0));
        let back = decode_f16(&encode_f16(&v, scale), scale);
        for (a, b) in v.iter().zip(&back) {
            assert!(b.is_finite());
            // Half has 11 significant bits: relative error <= 2^-11 for normals.
            assert!(
                (a - b).abs() <= a.abs() * 2f32.powi(-11) + 1e-3,
                "{a} -> {b}"
            );
        }
        // Without the scale the same block overflows.
        assert!(decode_f16(&encode_f16(&v, 1.0), 1.0)
            .iter()
            .any(|x| x.is_infinite()));
    }

    #[test]
    fn int8_round_trip_error_is_half_a_step() {
        let v: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 32.0) / 7.0)
            .collect();
        let scale = i8_scale(&v);
        let back = decode_i8(&encode_i8(&v, scale), scale);
        for (a, b) in v.iter().zip(&back) {
            assert!((a - b).abs() <= scale * 0.5 + 1e-6);
        }
        assert_eq!(decode_i8(&encode_i8(&[0.0; 4], 1.0), 1.0), vec![0.0; 4]);
    }
}
