//! Kernel speed on a cache-resident matrix (256 rows of 576 values, Q4_1), one thread,
//! per SIMD level: nanoseconds per block and token. A benchmark, not a test.
use fornax_cpu::{
    matmul_many, InterleavedWeights, Q8Activations, QuantFormat, QuantWeights, SimdLevel,
};
use std::time::Instant;
fn main() {
    fornax_cpu::set_threads(1).unwrap();
    let cols = 576;
    let rows = 256;
    let blocks = rows * cols / 32;
    let codes: Vec<u8> = (0..blocks * 16).map(|i| (i * 37 % 251) as u8).collect();
    let scales: Vec<u16> = (0..blocks * 2).map(|i| 0x2000 + (i % 512) as u16).collect();
    let w = QuantWeights::new(QuantFormat::Q4_1, rows, cols, &codes, &scales, &[]).unwrap();
    let w = InterleavedWeights::new(&w);
    for tokens in [1usize, 4] {
        let x: Vec<f32> = (0..tokens * cols)
            .map(|i| (i as f32 * 0.01).sin())
            .collect();
        let acts = Q8Activations::quantize(&x, tokens, cols);
        for level in SimdLevel::available() {
            let n = 2000;
            let t = Instant::now();
            for _ in 0..n {
                std::hint::black_box(matmul_many(&[&w], &acts, level));
            }
            let s = t.elapsed().as_secs_f64() / n as f64;
            println!(
                "{tokens} tokens {:>12}: {:.1} us per call, {:.2} ns per block-token",
                level.name(),
                s * 1e6,
                s * 1e9 / (blocks * tokens) as f64
            );
        }
    }
}
