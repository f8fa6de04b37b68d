//! Kernel speed alone: one token against Q4_1 weights the size of the default model's
//! layers (all 30 layers' matrices, 106M values), per SIMD level. A benchmark, not a test.
use fornax_cpu::{
    matmul_many, InterleavedWeights, Q8Activations, QuantFormat, QuantWeights, SimdLevel,
};
use std::time::Instant;

fn main() {
    let cols = 576;
    let rows = 30 * (576 * 2 + 192 * 2 + 1536 * 2) + 30 * 576 * 1536 / 576; // approx
    let blocks = rows * cols / 32;
    let codes: Vec<u8> = (0..blocks * 16).map(|i| (i * 37 % 251) as u8).collect();
    let scales: Vec<u16> = (0..blocks * 2).map(|i| 0x2000 + (i % 512) as u16).collect();
    let w = QuantWeights::new(QuantFormat::Q4_1, rows, cols, &codes, &scales).unwrap();
    let w = InterleavedWeights::new(&w);
    let bytes = codes.len() + 2 * scales.len();
    for tokens in [1usize, 2, 4, 8, 32] {
        let x: Vec<f32> = (0..tokens * cols)
            .map(|i| (i as f32 * 0.01).sin())
            .collect();
        let acts = Q8Activations::quantize(&x, tokens, cols);
        for level in SimdLevel::available().into_iter().skip(1) {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                let out = matmul_many(&[&w], &acts, level);
                std::hint::black_box(out);
                best = best.min(t.elapsed().as_secs_f64());
            }
            println!(
                "{tokens:>2} tokens {:>12}: {:.2} ms, {:.2} GB/s of weights, {:.1} GMAC/s",
                level.name(),
                best * 1e3,
                bytes as f64 / best / 1e9,
                (rows * cols * tokens) as f64 / best / 1e9
            );
        }
    }
}
