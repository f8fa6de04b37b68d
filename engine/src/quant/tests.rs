use fornax_cpu::{InterleavedWeights, Q8Activations, SimdLevel};
use half::f16;
use rand::{rngs::StdRng, Rng, SeedableRng};

use super::PackedMatrix;
use crate::gguf::GgmlType;

/// Where a block's IEEE halves (`d`, and `m` or `dmin`) lie.
fn half_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    }
}

/// The block types the CPU kernels read.
const KERNEL_TYPES: [GgmlType; 10] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q3_K,
    GgmlType::Q2_K,
];

/// `values / block_elements` blocks of `ty`: every byte from `code`, the halves from
/// `half` (scales of either sign over a few octaves in the random case).
fn blocks_with(
    ty: GgmlType,
    values: usize,
    mut code: impl FnMut(usize) -> u8,
    mut half: impl FnMut() -> f32,
) -> Vec<u8> {
    let bb = ty.block_bytes() as usize;
    let mut bytes: Vec<u8> = (0..values / ty.block_elements() as usize * bb)
        .map(&mut code)
        .collect();
    for block in bytes.chunks_exact_mut(bb) {
        for &at in half_offsets(ty) {
            block[at..at + 2].copy_from_slice(&f16::from_f32(half()).to_le_bytes());
        }
    }
    bytes
}

/// Blocks for 768 values (an odd count of 32-blocks, so the FP16 scales need a padding
/// half; three K-quant super-blocks) with every code.
fn blocks(ty: GgmlType) -> Vec<u8> {
    let mut h = 0.0f32;
    blocks_with(
        ty,
        768,
        |i| (i as u8).wrapping_mul(37).wrapping_add((i / 101) as u8),
        || {
            h += 1.0;
            0.0625 * h - 0.5
        },
    )
}

#[test]
fn packed_words_decode_exactly_as_the_gguf_blocks() {
    for ty in KERNEL_TYPES {
        let bytes = blocks(ty);
        let mut want = vec![0.0f32; 768];
        ty.dequantize(&bytes, &mut want);
        let packed = PackedMatrix::pack(ty, &bytes, 1, 768).unwrap();
        assert_eq!(packed.dequantize(), want, "{ty:?}");
        // Legacy blocks as small as the file, give or take a padding half; the K-quants'
        // codes as the file packs them, their scales a byte a step where the file packs
        // six bits (Q2_K: four): Q4_K, Q5_K and Q6_K within 3%, Q3_K 6%, Q2_K 20%.
        let file = ty.bytes_for(768).unwrap();
        let limit = match ty {
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => file * 103 / 100,
            GgmlType::Q3_K => file * 106 / 100,
            GgmlType::Q2_K => file * 120 / 100,
            _ => file + 2,
        };
        assert!(packed.bytes() as u64 <= limit, "{ty:?}: {}", packed.bytes());
        // What the loader sizes bands and the browser's fit check by, padding aside: the
        // larger of the host's words and the device's (K5 has three scale words there).
        let row = PackedMatrix::row_bytes(ty, 768).unwrap();
        let (quants, scales) = packed.device_words();
        let largest = packed.bytes().max(4 * (quants.len() + scales.len()));
        assert!(row.abs_diff(largest) <= 2, "{ty:?}: {largest} vs {row}");
    }
}

/// The CPU formats' code bytes decode to integer codes and encode back to the same bytes,
/// for every byte pattern of a block (random blocks), and every code in range survives the
/// trip the other way.
#[test]
fn cpu_code_layouts_encode_what_they_decode() {
    use fornax_cpu::QuantFormat;
    let mut rng = StdRng::seed_from_u64(3);
    for format in QuantFormat::ALL {
        for _ in 0..50 {
            let bytes: Vec<u8> = (0..format.code_bytes()).map(|_| rng.random()).collect();
            let q = format.block_codes(&bytes);
            assert_eq!(format.encode_codes(&q), bytes, "{format:?}");
            assert_eq!(
                format.block_codes(&format.encode_codes(&q)),
                q,
                "{format:?}"
            );
        }
    }
}

#[test]
fn pack_refuses_what_it_cannot_hold() {
    let bytes = blocks(GgmlType::Q8_0);
    assert!(PackedMatrix::pack(GgmlType::F32, &bytes, 1, 768).is_none());
    // Rows of 48 values are not whole blocks; a byte count that disagrees with the shape.
    assert!(PackedMatrix::pack(GgmlType::Q8_0, &bytes[..3 * 34], 2, 48).is_none());
    assert!(PackedMatrix::pack(GgmlType::Q8_0, &bytes[..60], 1, 96).is_none());
    // Rows of K-quants that are not whole super-blocks.
    let k = blocks(GgmlType::Q4_K);
    assert!(PackedMatrix::pack(GgmlType::Q4_K, &k, 6, 128).is_none());
    assert!(PackedMatrix::pack(GgmlType::Q4_K, &k[..144], 1, 768).is_none());
}

/// `rows * cols / block_elements` random GGUF blocks of `ty`: scales of either sign over
/// a few octaves, every code value.
fn random_blocks(ty: GgmlType, rows: usize, cols: usize, rng: &mut StdRng) -> Vec<u8> {
    let codes: Vec<u8> = (0..rows * cols * 2).map(|_| rng.random()).collect();
    let halves: Vec<f32> = (0..rows * cols)
        .map(|_| rng.random_range(-0.05f32..0.05))
        .collect();
    let mut h = halves.into_iter();
    blocks_with(ty, rows * cols, |i| codes[i], || h.next().unwrap())
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
            (1, 256usize, 1),
            (37, 96, 3),
            (70, 160, 9),
            (19, 768, 4),
            (64, 1536, 6),
            // 16 tokens or more: the K formats' steps converted once per product.
            (11, 512, 18),
        ] {
            if !cols.is_multiple_of(ty.block_elements() as usize) {
                continue;
            }
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
