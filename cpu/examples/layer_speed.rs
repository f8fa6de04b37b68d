//! The default model's four products per layer (Q/K/V joined, O, gate/up joined, down),
//! each layer's weights its own (so they stream from memory as in decoding), at 1 to 4
//! tokens: what a verification pass of speculative decoding adds per drafted token.
//! A benchmark, not a test.
use fornax_cpu::{matmul_many, InterleavedWeights, Q8Activations, QuantFormat, QuantWeights};
use std::time::Instant;

/// A Q4_1 matrix of `rows x cols` with varied codes and scales.
fn matrix(rows: usize, cols: usize, seed: usize) -> InterleavedWeights {
    let blocks = rows * cols / 32;
    let codes: Vec<u8> = (0..blocks * 16)
        .map(|i| ((i + seed) * 37 % 251) as u8)
        .collect();
    let scales: Vec<u16> = (0..blocks * 2)
        .map(|i| 0x2000 + ((i + seed) % 512) as u16)
        .collect();
    InterleavedWeights::new(
        &QuantWeights::new(QuantFormat::Q4_1, rows, cols, &codes, &scales, &[]).unwrap(),
    )
}

fn main() {
    let level = fornax_cpu::SimdLevel::best();
    let layers = 30;
    let shapes = [
        ("qkv", 960, 576),
        ("o", 576, 576),
        ("gate_up", 3072, 576),
        ("down", 576, 1536),
    ];
    let weights: Vec<Vec<InterleavedWeights>> = (0..layers)
        .map(|l| {
            shapes
                .iter()
                .map(|&(_, r, c)| matrix(r, c, l * 7 + r))
                .collect()
        })
        .collect();
    println!("level {}, {} threads", level.name(), fornax_cpu::threads());
    for round in 0..2 {
        for tokens in 1..=4usize {
            let acts: Vec<Q8Activations> = shapes
                .iter()
                .map(|&(_, _, c)| {
                    let x: Vec<f32> = (0..tokens * c).map(|i| (i as f32 * 0.01).sin()).collect();
                    Q8Activations::quantize(&x, tokens, c)
                })
                .collect();
            let mut spent = [0.0f64; 4];
            let reps = 20;
            for _ in 0..reps {
                for layer in &weights {
                    for (k, w) in layer.iter().enumerate() {
                        let t = Instant::now();
                        std::hint::black_box(matmul_many(&[w], &acts[k], level));
                        spent[k] += t.elapsed().as_secs_f64();
                    }
                }
            }
            if round == 1 {
                let per = |k: usize| spent[k] / (reps * layers) as f64 * 1e6;
                println!(
                    "{tokens} tokens: qkv {:.1} us, o {:.1}, gate_up {:.1}, down {:.1}; all layers {:.2} ms",
                    per(0), per(1), per(2), per(3),
                    spent.iter().sum::<f64>() / reps as f64 * 1e3
                );
            }
        }
    }
}
