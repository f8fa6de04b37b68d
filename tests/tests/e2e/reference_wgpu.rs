//! The real model on the wgpu backend (lavapipe on machines without a GPU) against the float reference.

use crate::common::{run_check, run_on, Check, PrefixLogprobs};
use fornax_backends::BackendKind;
use fornax_engine::score::perplexity;

#[test]
fn last_logits_match_float_reference() {
    run_check(BackendKind::Wgpu, Check::Logits);
}

#[test]
fn greedy_tokens_match_float_reference() {
    run_check(BackendKind::Wgpu, Check::Greedy);
}

/// Scoring 2,212 tokens takes lavapipe about nine minutes, so CI scores the first 320
/// (a chunk of 256, then one of 64 attending across it) and compares every token
/// with the CPU backend on FP32 weights (the same values as wgpu's quantized weights, both
/// multiplied in FP32), whose full-text perplexity `reference_cpu` checks against the
/// float reference. `FORNAX_FULL_PPL=1` also runs the full-text check here.
#[test]
fn perplexity_matches_cpu_backend_token_by_token() {
    use fornax_engine::model::LoadOptions;
    const TOKENS: usize = 320;
    let dequantized = LoadOptions {
        dequantize: true,
        ..LoadOptions::default()
    };
    let cpu = run_on(BackendKind::Cpu, PrefixLogprobs(TOKENS, dequantized)).unwrap();
    let gpu = run_on(
        BackendKind::Wgpu,
        PrefixLogprobs(TOKENS, LoadOptions::default()),
    )
    .expect("a wgpu adapter");
    assert_eq!(gpu.len(), TOKENS - 1);
    let worst = cpu
        .iter()
        .zip(&gpu)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let (p_cpu, p_gpu) = (perplexity(&cpu), perplexity(&gpu));
    let rel = (p_gpu - p_cpu).abs() / p_cpu;
    eprintln!(
        "first {TOKENS} tokens: perplexity wgpu {p_gpu:.4}, CPU {p_cpu:.4} ({:.4}%), max |logprob diff| {worst:.2e}",
        rel * 100.0
    );
    assert!(worst < 2e-3, "per-token log-probability differs by {worst}");
    assert!(rel < 1e-4, "perplexity differs by {:.4}%", rel * 100.0);
    if std::env::var_os("FORNAX_FULL_PPL").is_some() {
        run_check(BackendKind::Wgpu, Check::Perplexity);
    }
}

/// Quantized weights (the default on wgpu) against the same model dequantized to FP32 at
/// load (`--dequantize`): both multiply the same values in FP32, so last-position logits
/// differ only by summation order. Tolerance 2e-3 absolute on logits of size ~20, a tenth
/// of the float-reference tolerance.
#[test]
fn quantized_weights_match_f32_weights() {
    use crate::common::{model_file, read_reference, Prompts};
    use fornax_backends::{BackendTask, DeviceInfo};
    use fornax_engine::gguf::GgufFile;
    use fornax_engine::model::{LoadOptions, Model};
    use fornax_engine::{prefill, EngineBackend};

    struct Compare;
    impl BackendTask for Compare {
        type Output = ();
        fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) {
            let file = model_file().bytes();
            let gguf = GgufFile::parse(file).unwrap();
            let load = |dequantize| {
                Model::<B>::from_gguf_with(
                    &gguf,
                    &device,
                    LoadOptions {
                        dequantize,
                        ..LoadOptions::default()
                    },
                    &mut |_, _| {},
                )
                .unwrap()
            };
            let (quant, dense) = (load(false), load(true));
            let quantized = quant.matrices().filter(|m| m.is_quantized()).count();
            assert_eq!(
                quantized,
                quant.matrices().count(),
                "every matrix stays quantized"
            );
            assert!(dense.matrices().all(|m| !m.is_quantized()));
            let ratio = quant.weight_bytes() as f64 / file.len() as f64;
            eprintln!(
                "{}: weights {} bytes quantized ({ratio:.3} of the file), {} bytes FP32",
                info.adapter,
                quant.weight_bytes(),
                dense.weight_bytes()
            );
            assert!((0.9..=1.1).contains(&ratio), "weights vs file: {ratio}");

            let prompts: Prompts = read_reference("prompts.json");
            for case in &prompts.prompts {
                let q = prefill(&quant, &case.prompt_ids, &mut quant.new_cache(), 256).unwrap();
                let f = prefill(&dense, &case.prompt_ids, &mut dense.new_cache(), 256).unwrap();
                let worst = q
                    .iter()
                    .zip(&f)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                eprintln!(
                    "{:?}: max |logit diff| quantized vs FP32 weights {worst:.2e}",
                    case.prompt
                );
                assert!(worst <= 2e-3, "{:?}: {worst}", case.prompt);
            }
        }
    }
    run_on(BackendKind::Wgpu, Compare).expect("a wgpu adapter");
}
