//! The real model on the CPU backend against the float reference.

use crate::common::{run_check, Check};
use fornax_backends::BackendKind;

#[test]
fn last_logits_match_float_reference() {
    run_check(BackendKind::Cpu, Check::Logits);
}

#[test]
fn greedy_tokens_match_float_reference() {
    run_check(BackendKind::Cpu, Check::Greedy);
}

#[test]
fn perplexity_matches_float_reference() {
    run_check(BackendKind::Cpu, Check::Perplexity);
}
