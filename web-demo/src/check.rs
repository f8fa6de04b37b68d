//! A self-check on the adapter the page got: burn's operations and our quantized kernels
//! against values computed on the host, each within a stated tolerance. WebGPU
//! implementations differ (subgroups, limits), so this tells whether this one computes
//! what lavapipe and CUDA compute.

use burn_tensor::{activation::softmax, Int, Tensor, TensorData};
use fornax_engine::gguf::GgmlType;
use fornax_engine::quant::{PackedMatrix, QuantMatrix, QuantOps};
use rand::{rngs::StdRng, Rng, SeedableRng};
use wasm_bindgen::prelude::*;

use crate::device::{device, WebBackend as B};

/// Absolute tolerance of FP32 results with sums over 576 terms.
const TOLERANCE: f32 = 1e-3;

async fn host(t: Tensor<B, 2>) -> Result<Vec<f32>, String> {
    fornax_engine::logits_to_vec_async(t)
        .await
        .map_err(|e| e.to_string())
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(
            0.0,
            |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
        )
}

/// `a @ b^T` for row-major `a` `[n, k]` and `b` `[m, k]`.
fn host_matmul_t(a: &[f32], b: &[f32], k: usize) -> Vec<f32> {
    a.chunks(k)
        .flat_map(|row| {
            b.chunks(k)
                .map(move |col| row.iter().zip(col).map(|(x, y)| x * y).sum())
        })
        .collect()
}

fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// Random Q4_1 blocks for a `[rows, cols]` matrix.
fn random_q4_1(rng: &mut StdRng, rows: usize, cols: usize) -> PackedMatrix {
    let mut bytes = Vec::new();
    for _ in 0..rows * cols / 32 {
        let d = half::f16::from_f32(rng.random_range(0.001..0.05));
        let m = half::f16::from_f32(rng.random_range(-0.2..0.0));
        bytes.extend(d.to_le_bytes());
        bytes.extend(m.to_le_bytes());
        bytes.extend((0..16).map(|_| rng.random::<u8>()));
    }
    PackedMatrix::pack(GgmlType::Q4_1, &bytes, rows, cols).expect("whole blocks")
}

struct Report(Vec<String>, bool);

impl Report {
    fn line(&mut self, what: &str, diff: f32) {
        let ok = diff <= TOLERANCE;
        self.1 &= ok;
        self.0.push(format!(
            "{} {what}: max |diff| {diff:.2e}",
            if ok { "ok" } else { "FAIL" }
        ));
    }
}

/// Runs the checks; resolves to one line per check and a last line `all within 1e-3` or
/// `some checks failed`.
#[wasm_bindgen(js_name = checkKernels)]
pub async fn check_kernels() -> Result<String, JsError> {
    run().await.map_err(|e| JsError::new(&e))
}

async fn run() -> Result<String, String> {
    let (device, _) = device().await;
    let mut rng = StdRng::seed_from_u64(5);
    let mut report = Report(Vec::new(), true);
    let (k, m) = (576, 96);
    let upload = |v: &[f32], shape: [usize; 2]| {
        Tensor::<B, 2>::from_data(TensorData::new(v.to_vec(), shape), &device)
    };

    for n in [1, 5, 40] {
        let a = random(&mut rng, n * k);
        let x = upload(&a, [n, k]);
        // Reductions (RMSNorm's mean of squares).
        let got = host(x.clone().powf_scalar(2.0).mean_dim(1)).await?;
        let want: Vec<f32> = a
            .chunks(k)
            .map(|r| r.iter().map(|v| v * v).sum::<f32>() / k as f32)
            .collect();
        report.line(
            &format!("burn mean of squares, {n} x {k}"),
            max_diff(&got, &want),
        );
        // Softmax over rows.
        let got = host(softmax(x.clone(), 1)).await?;
        let want: Vec<f32> = a
            .chunks(k)
            .flat_map(|r| {
                let max = r.iter().cloned().fold(f32::MIN, f32::max);
                let sum: f32 = r.iter().map(|v| (v - max).exp()).sum();
                r.iter().map(move |v| (v - max).exp() / sum)
            })
            .collect();
        report.line(&format!("burn softmax, {n} x {k}"), max_diff(&got, &want));
        // FP32 matmul.
        let b = random(&mut rng, m * k);
        let got = host(x.clone().matmul(upload(&b, [m, k]).transpose())).await?;
        report.line(
            &format!("burn matmul, {n} x {k} x {m}"),
            max_diff(&got, &host_matmul_t(&a, &b, k)),
        );
        // Our quantized matmul against the host product with the dequantized matrix.
        let packed = random_q4_1(&mut rng, 160, k);
        let w = QuantMatrix::<B>::upload(&packed, &device);
        let got = host(B::quant_matmul(x, &w)).await?;
        let want = host_matmul_t(&a, &packed.dequantize(), k);
        report.line(
            &format!("Q4_1 matmul kernel, {n} x {k} x 160"),
            max_diff(&got, &want),
        );
    }
    // Our row gather (the token embedding).
    let packed = random_q4_1(&mut rng, 300, k);
    let w = QuantMatrix::<B>::upload(&packed, &device);
    let ids = [0usize, 7, 299, 128];
    let got = host(B::quant_rows(
        Tensor::<B, 1, Int>::from_data(
            TensorData::new(ids.iter().map(|&i| i as i32).collect(), [ids.len()]),
            &device,
        ),
        &w,
    ))
    .await?;
    let all = packed.dequantize();
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&i| all[i * k..(i + 1) * k].to_vec())
        .collect();
    report.line("Q4_1 row gather kernel, 4 rows", max_diff(&got, &want));

    let verdict = match report.1 {
        true => format!("all within {TOLERANCE:.0e}"),
        false => "some checks failed".to_string(),
    };
    report.0.push(verdict);
    Ok(report.0.join("\n"))
}
