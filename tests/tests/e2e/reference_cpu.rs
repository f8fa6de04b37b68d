//! The real model on the CPU backend against the float reference: weights dequantized to
//! FP32 (`--dequantize`, strict checks) and kept quantized (the default: our SIMD kernels
//! with 8-bit activations, checked as llama.cpp's outputs would be).

use crate::common::{run_check_with, Check, MIN_MARGIN, Q8_MIN_MARGIN};
use fornax_backends::BackendKind;
use fornax_engine::model::LoadOptions;

const DEQUANTIZED: LoadOptions = LoadOptions {
    dequantize: true,
    reference_ops: false,
};
const QUANTIZED: LoadOptions = LoadOptions {
    dequantize: false,
    reference_ops: false,
};

#[test]
fn last_logits_match_float_reference() {
    run_check_with(BackendKind::Cpu, Check::Logits, DEQUANTIZED, MIN_MARGIN);
}

#[test]
fn greedy_tokens_match_float_reference() {
    run_check_with(BackendKind::Cpu, Check::Greedy, DEQUANTIZED, MIN_MARGIN);
}

#[test]
fn perplexity_matches_float_reference() {
    run_check_with(BackendKind::Cpu, Check::Perplexity, DEQUANTIZED, MIN_MARGIN);
}

/// 8-bit activations move logits by about as much as llama.cpp's do: greedy tokens equal
/// the float reference up to a step whose reference top-2 margin is below 0.25.
#[test]
fn quantized_greedy_tokens_match_float_reference() {
    run_check_with(BackendKind::Cpu, Check::Greedy, QUANTIZED, Q8_MIN_MARGIN);
}

/// Perplexity with quantized weights and 8-bit activations within 0.5% of the float
/// reference.
#[test]
fn quantized_perplexity_matches_float_reference() {
    run_check_with(
        BackendKind::Cpu,
        Check::Perplexity,
        QUANTIZED,
        Q8_MIN_MARGIN,
    );
}
