//! The real model on the wgpu backend (lavapipe on machines without a GPU) against the float reference.

use fornax_backends::BackendKind;
use fornax_tests::{run_check, Check};

#[test]
fn last_logits_match_float_reference() {
    run_check(BackendKind::Wgpu, Check::Logits);
}

#[test]
fn greedy_tokens_match_float_reference() {
    run_check(BackendKind::Wgpu, Check::Greedy);
}

#[test]
fn perplexity_matches_float_reference() {
    run_check(BackendKind::Wgpu, Check::Perplexity);
}
