//! Kernel speed alone: a few tokens against weights the size of the default model's
//! layers (all 30 layers' matrices, 106M values), per SIMD level, in the format named by
//! the first argument (default Q4_1; e.g. `K4`). A benchmark, not a test.
use fornax_cpu::{
    matmul_many, InterleavedWeights, Q8Activations, QuantFormat, QuantWeights, SimdLevel,
};
use std::time::Instant;

fn main() {
    let cols: usize = 576;
    let rows: usize = 30 * (576 * 2 + 192 * 2 + 1536 * 2) + 30 * 576 * 1536 / 576; // approx
    let name = std::env::args().nth(1).unwrap_or_else(|| "Q4_1".into());
    let format = *QuantFormat::ALL
        .iter()
        .find(|f| format!("{f:?}") == name)
        .expect("a format name, e.g. Q4_1 or K4");
    let rows = rows.next_multiple_of(8);
    let cols = cols.next_multiple_of(format.row_multiple());
    let blocks = rows * cols / 32;
    let codes: Vec<u8> = (0..blocks * format.code_bytes())
        .map(|i| (i * 37 % 251) as u8)
        .collect();
    let scales: Vec<u16> = (0..blocks * format.scale_halves())
        .map(|i| match format.super_scales() {
            true => (i % 61) as u16 * 0x0101,
            false => 0x2000 + (i % 512) as u16,
        })
        .collect();
    let supers: Vec<u16> = match format.super_scales() {
        true => (0..blocks / 4).map(|i| 0x1000 + (i % 512) as u16).collect(),
        false => Vec::new(),
    };
    let w = QuantWeights::new(format, rows, cols, &codes, &scales, &supers).unwrap();
    let w = InterleavedWeights::new(&w);
    let bytes = w.bytes();
    println!("{format:?}: {rows} x {cols}, {:.1} MB", bytes as f64 / 1e6);
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
