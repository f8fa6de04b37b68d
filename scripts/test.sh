#!/usr/bin/env bash
# The test command: formatting, lints (including the CUDA build, compiled without the
# CUDA toolkit), then every test on the real model on the CPU backend and on wgpu
# (lavapipe where there is no GPU). Fetches the model when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

step() { echo "== $* ($(date +%T))" >&2; }

step "format"
cargo fmt --all -- --check

step "fetch the default model if missing"
cargo run --release -q -p fornax -- fetch

step "tests"
cargo test --release --workspace

step "clippy, with the CUDA backend compiled in"
# cudarc cannot ask nvcc for the version here; pin the CUDA 12.8 API.
CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-12080}" \
    cargo clippy --release --workspace --all-targets --features fornax/cuda -- -D warnings

step "done"
