//! Every SIMD level this CPU (or this wasm module) has against the portable one, on
//! random blocks of each format and odd shapes: the outputs must be identical, and within
//! FP32 rounding of the dequantized product. The engine's unit tests check the same natively;
//! `examples/levels_agree.rs` runs it under arm64 emulation (`scripts/check-arm64.sh`)
//! and the browser demo's kernel check in wasm.

use crate::{InterleavedWeights, Q8Activations, QuantFormat, QuantWeights, SimdLevel};

/// A small deterministic generator (no dependency for a check).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    fn unit(&mut self) -> f32 {
        self.next() as f32 / (1u64 << 31) as f32 * 2.0 - 1.0
    }
}

/// Runs the check: a one-line summary, or what differed.
pub fn check_levels() -> Result<String, String> {
    let levels = SimdLevel::available();
    let names: Vec<_> = levels.iter().map(|l| l.name()).collect();
    let mut rng = Lcg(7);
    let mut checked = 0;
    for format in QuantFormat::ALL {
        // Up to 9 tokens the K formats convert their steps in every tile; from 16, once
        // per product.
        for (rows, cols, tokens) in [
            (1, 256, 1),
            (37, 96, 3),
            (70, 160, 9),
            (64, 1536, 6),
            (19, 512, 21),
        ] {
            if cols % format.row_multiple() != 0 {
                continue;
            }
            let blocks = rows * cols / 32;
            let codes: Vec<u8> = (0..blocks * format.code_bytes())
                .map(|_| rng.next() as u8)
                .collect();
            let half = |v: f32| half::f16::from_f32(v).to_bits();
            // IEEE halves, or the K formats' signed steps (two a word) and their
            // super-blocks' `d` and `-dmin`.
            let scales: Vec<u16> = match format.super_scales() {
                true => (0..blocks * format.scale_halves())
                    .map(|_| {
                        // Steps of either sign, as Q6_K's and Q3_K's scales are.
                        let w = rng.next();
                        let step = |k: u32| (((w >> k) % 96) as i32 - 48) as i8 as u8;
                        u16::from_le_bytes([step(0), step(8)])
                    })
                    .collect(),
                false => (0..blocks * format.scales())
                    .map(|_| half(rng.unit() * 0.05))
                    .collect(),
            };
            let supers: Vec<u16> = match format.super_scales() {
                true => (0..blocks / crate::SUPER_GROUPS * 2)
                    .map(|_| half(rng.unit() * 0.002))
                    .collect(),
                false => Vec::new(),
            };
            let w = QuantWeights::new(format, rows, cols, &codes, &scales, &supers)
                .map_err(|e| e.to_string())?;
            let il = InterleavedWeights::new(&w);
            let x: Vec<f32> = (0..tokens * cols).map(|_| rng.unit() * 2.0).collect();
            let acts = Q8Activations::quantize(&x, tokens, cols);
            let xq = acts.dequantize();
            let outs: Vec<Vec<f32>> = levels.iter().map(|&l| il.matmul_q8(&acts, l)).collect();
            for (l, out) in levels.iter().zip(&outs) {
                if out != &outs[0] {
                    return Err(format!(
                        "{format:?} [{rows}x{cols}]: {} differs from {}",
                        l.name(),
                        levels[0].name()
                    ));
                }
            }
            let mut row = vec![0.0f32; cols];
            for r in 0..rows {
                w.dequantize_row(r, &mut row);
                for t in 0..tokens {
                    let xt = &xq[t * cols..(t + 1) * cols];
                    let exact: f64 = row.iter().zip(xt).map(|(&a, &b)| f64::from(a * b)).sum();
                    let size: f64 = row
                        .iter()
                        .zip(xt)
                        .map(|(&a, &b)| f64::from((a * b).abs()))
                        .sum();
                    let got = f64::from(outs[0][t * rows + r]);
                    if (got - exact).abs() > 1e-5 * size + 1e-6 {
                        return Err(format!(
                            "{format:?} [{rows}x{cols}] token {t} row {r}: {got} vs {exact}"
                        ));
                    }
                }
            }
            checked += 1;
        }
    }
    Ok(format!(
        "{checked} products identical at every level ({}) and equal to the dequantized product",
        names.join(", ")
    ))
}
