use fornax_cpu::{InterleavedWeights, Q8Activations, SimdLevel};
use half::f16;
use rand::{rngs::StdRng, Rng, SeedableRng};

use super::PackedMatrix;
use crate::gguf::GgmlType;

/// Bytes of a block after its halves (Q5_0: `qh` and the nibbles).
fn code_bytes(ty: GgmlType) -> usize {
    let halves = if ty == GgmlType::Q4_1 { 2 } else { 1 };
    ty.block_bytes() as usize - 2 * halves
}

/// The block types the kernels read (Q5_0 on the CPU only).
const KERNEL_TYPES: [GgmlType; 4] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
];

/// Three blocks (an odd count, so the FP16 scales need a padding half) with every code.
fn blocks(ty: GgmlType) -> Vec<u8> {
    let mut bytes = Vec::new();
    for b in 0..3u8 {
        bytes.extend(f16::from_f32(0.125 * f32::from(b + 1)).to_le_bytes());
        if ty == GgmlType::Q4_1 {
            bytes.extend(f16::from_f32(-0.5 + f32::from(b)).to_le_bytes());
        }
        let codes = code_bytes(ty) as u8;
        bytes.extend((0..codes).map(|j| j.wrapping_mul(37).wrapping_add(b * 101)));
    }
    bytes
}

#[test]
fn packed_words_decode_exactly_as_the_gguf_blocks() {
    for ty in KERNEL_TYPES {
        let bytes = blocks(ty);
        let mut want = vec![0.0f32; 96];
        ty.dequantize(&bytes, &mut want);
        let packed = PackedMatrix::pack(ty, &bytes, 1, 96).unwrap();
        assert_eq!(packed.dequantize(), want, "{ty:?}");
        // As small as the file, give or take a padding half.
        assert!(
            packed.bytes() as u64 <= ty.bytes_for(96).unwrap() + 2,
            "{ty:?}"
        );
    }
}

#[test]
fn pack_refuses_what_it_cannot_hold() {
    let bytes = blocks(GgmlType::Q8_0);
    assert!(PackedMatrix::pack(GgmlType::F32, &bytes, 1, 96).is_none());
    // Rows of 48 values are not whole blocks; a byte count that disagrees with the shape.
    assert!(PackedMatrix::pack(GgmlType::Q8_0, &bytes, 2, 48).is_none());
    assert!(PackedMatrix::pack(GgmlType::Q8_0, &bytes[..60], 1, 96).is_none());
}

/// `rows * cols / 32` random GGUF blocks of `ty`: scales of either sign over a few
/// octaves, every code value.
fn random_blocks(ty: GgmlType, rows: usize, cols: usize, rng: &mut impl Rng) -> Vec<u8> {
    let mut bytes = Vec::new();
    for _ in 0..rows * cols / 32 {
        let d = rng.random_range(-0.05f32..0.05);
        bytes.extend(f16::from_f32(d).to_le_bytes());
        if ty == GgmlType::Q4_1 {
            bytes.extend(f16::from_f32(rng.random_range(-0.3f32..0.3)).to_le_bytes());
        }
        bytes.extend((0..code_bytes(ty)).map(|_| rng.random::<u8>()));
    }
    bytes
}

/// The activations' SIMD quantization gives exactly the portable one's codes, scales and
/// sums: on random values, on values at exact ties of the rounding (`k + 0.5` steps, which
/// go to the even code), on an all-zero block and on blocks led by their largest value.
#[test]
fn activation_quantization_matches_the_portable_code_exactly() {
    let mut rng = StdRng::seed_from_u64(11);
    let cols = 1536;
    let mut x: Vec<f32> = (0..3 * cols)
        .map(|_| rng.random_range(-3.0f32..3.0))
        .collect();
    // Block 1: max 127 so the step is 1, every other value a tie `k + 0.5`.
    x[32] = 127.0;
    for (i, v) in x[33..64].iter_mut().enumerate() {
        *v = (i as f32 - 15.0) + 0.5;
    }
    // Block 2: all zero (scale 0).
    x[64..96].fill(0.0);
    // Block 3: the largest magnitude negative.
    x[96] = -50.0;
    for tokens in [1, 3] {
        let x = &x[..tokens * cols];
        let simd = Q8Activations::quantize(x, tokens, cols);
        let portable = Q8Activations::quantize_portable(x, tokens, cols);
        assert_eq!(simd, portable, "{tokens} tokens");
        // The ties went to even codes (so the check above covers the rounding rule).
        let codes = &simd.dequantize()[33..64];
        assert!(
            codes.iter().all(|c| (c.round() as i32) % 2 == 0),
            "{codes:?}"
        );
    }
}

/// The CPU kernels at every SIMD level this machine has (and the portable one), on random
/// blocks of each format and odd shapes, against the GGUF reader's dequantization:
/// - with the activations the kernels multiply (8-bit, `Q8Activations::dequantize`), equal
///   up to FP32 rounding;
/// - with the FP32 activations, within the activations' rounding: at most half a step
///   `d_x / 2` per value, times `|w|`.
#[test]
fn cpu_kernels_match_the_gguf_dequantization_at_every_simd_level() {
    let mut rng = StdRng::seed_from_u64(7);
    let levels = SimdLevel::available();
    assert!(levels.contains(&SimdLevel::Portable));
    for ty in KERNEL_TYPES {
        for (rows, cols, tokens) in [
            (1, 32, 1),
            (37, 96, 3),
            (70, 160, 9),
            (19, 576, 4),
            (64, 1536, 6),
        ] {
            let bytes = random_blocks(ty, rows, cols, &mut rng);
            let mut w = vec![0.0f32; rows * cols];
            ty.dequantize(&bytes, &mut w);
            let packed = PackedMatrix::pack(ty, &bytes, rows, cols).unwrap();
            let il = InterleavedWeights::new(&packed.cpu_view());
            let x: Vec<f32> = (0..tokens * cols)
                .map(|_| rng.random_range(-2.0f32..2.0))
                .collect();
            let acts = Q8Activations::quantize(&x, tokens, cols);
            let xq = acts.dequantize();
            // The levels' integer sums are exact and they accumulate with the same fused
            // multiply-adds in the same order: their results are identical, so which one
            // `SimdLevel::best` measures fastest never changes an output.
            let all: Vec<Vec<f32>> = levels.iter().map(|&l| il.matmul_q8(&acts, l)).collect();
            assert!(
                all.windows(2).all(|p| p[0] == p[1]),
                "{ty:?} [{rows}x{cols}]: levels differ"
            );
            for &level in &levels {
                let got = il.matmul_q8(&acts, level);
                assert_eq!(got.len(), tokens * rows);
                // A token's result does not depend on the batch it is in.
                let alone = Q8Activations::quantize(&x[..cols], 1, cols);
                let alone = il.matmul_q8(&alone, level);
                assert_eq!(
                    alone,
                    got[..rows],
                    "{ty:?} {}: alone vs batched",
                    level.name()
                );
                for t in 0..tokens {
                    for r in 0..rows {
                        let wr = &w[r * cols..(r + 1) * cols];
                        let xt = &x[t * cols..(t + 1) * cols];
                        let xqt = &xq[t * cols..(t + 1) * cols];
                        let exact: f64 = wr.iter().zip(xqt).map(|(&a, &b)| f64::from(a * b)).sum();
                        let magnitude: f64 = wr
                            .iter()
                            .zip(xqt)
                            .map(|(&a, &b)| f64::from((a * b).abs()))
                            .sum();
                        let g = f64::from(got[t * rows + r]);
                        let at =
                            format!("{ty:?} {} [{rows}x{cols}] token {t} row {r}", level.name());
                        assert!(
                            (g - exact).abs() <= 1e-5 * magnitude + 1e-6,
                            "{at}: {g} vs {exact}"
                        );
                        let fp32: f64 = wr.iter().zip(xt).map(|(&a, &b)| f64::from(a * b)).sum();
                        let bound: f64 = wr
                            .chunks_exact(32)
                            .zip(xt.chunks_exact(32))
                            .map(|(wb, xb)| {
                                let step = xb.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0;
                                wb.iter()
                                    .map(|v| f64::from(v.abs() * step / 2.0))
                                    .sum::<f64>()
                            })
                            .sum();
                        assert!(
                            (g - fp32).abs() <= bound * 1.001 + 1e-5,
                            "{at}: {g} vs FP32 {fp32}"
                        );
                    }
                }
            }
        }
    }
}
