//! Dequantized tensors of the real model against the `gguf` Python package's values.

use crate::common::{model_file, read_reference};
use fornax_engine::gguf::GgufFile;
use serde::Deserialize;

#[derive(Deserialize)]
struct Dequant {
    tensors: Vec<TensorRef>,
}

#[derive(Deserialize)]
struct TensorRef {
    name: String,
    #[serde(rename = "type")]
    ty: String,
    shape_gguf: Vec<u64>,
    n: usize,
    first64: Vec<f32>,
    last16: Vec<f32>,
    sum: f64,
    sum_sq: f64,
}

#[test]
fn dequantized_values_match_reference() {
    let file = GgufFile::parse(model_file().bytes()).unwrap();
    let reference: Dequant = read_reference("dequant.json");
    assert_eq!(reference.tensors.len(), 5);
    for t in &reference.tensors {
        let info = file.tensor(&t.name).unwrap();
        assert_eq!(
            format!("{:?}", info.ggml_type).to_uppercase(),
            t.ty.to_uppercase(),
            "{}",
            t.name
        );
        assert_eq!(info.shape, t.shape_gguf);
        let (values, _) = file.dequantize(&t.name).unwrap();
        assert_eq!(values.len(), t.n);
        assert_eq!(&values[..64], &t.first64[..], "{}: first 64", t.name);
        assert_eq!(&values[t.n - 16..], &t.last16[..], "{}: last 16", t.name);
        let sum: f64 = values.iter().map(|&v| f64::from(v)).sum();
        let sum_sq: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        assert!(
            (sum - t.sum).abs() <= 1e-6 * t.sum_sq.max(1.0),
            "{}: sum {sum} vs {}",
            t.name,
            t.sum
        );
        assert!(
            (sum_sq - t.sum_sq).abs() <= 1e-9 * t.sum_sq * t.n as f64,
            "{}: sum_sq {sum_sq} vs {}",
            t.name,
            t.sum_sq
        );
    }
}

/// What the browser demo checks against the adapter's binding limit before loading: the
/// largest weight buffer is the token embedding, 113 MB in FP32 (just under WebGPU's
/// 128 MiB default), 30 MB kept in its Q8_0 blocks.
#[test]
fn largest_weight_follows_what_the_backend_keeps_quantized() {
    use fornax_backends::{CpuBackend, WgpuBackend};
    use fornax_engine::model::{LoadOptions, Model};

    let file = GgufFile::parse(model_file().bytes()).unwrap();
    let embd = file.tensor("token_embd.weight").unwrap();
    let fp32 = 4 * 49152 * 576;

    // wgpu and the CPU backend keep the blocks: the embedding (Q8_0 in this file) takes
    // its file size, 34 bytes per 32 values.
    let quant = LoadOptions::default();
    let wgpu = Model::<WgpuBackend>::largest_weight(&file, quant).unwrap();
    assert_eq!(wgpu, ("token_embd.weight".to_string(), embd.size));
    let cpu = Model::<CpuBackend>::largest_weight(&file, quant).unwrap();
    assert_eq!(cpu, ("token_embd.weight".to_string(), embd.size));
    assert_eq!(format!("{:?}", embd.ggml_type), "Q8_0");
    assert_eq!(embd.size, 49152 * 576 / 32 * 34);

    // --dequantize is FP32 again.
    let dequantize = LoadOptions {
        dequantize: true,
        ..LoadOptions::default()
    };
    let wgpu_f32 = Model::<WgpuBackend>::largest_weight(&file, dequantize).unwrap();
    assert_eq!(wgpu_f32.1, fp32);
    let cpu_f32 = Model::<CpuBackend>::largest_weight(&file, dequantize).unwrap();
    assert_eq!(cpu_f32.1, fp32);
}
