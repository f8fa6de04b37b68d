#!/usr/bin/env bash
# The test command: formatting, lints (including the CUDA build, compiled without the
# CUDA toolkit), then every test on the real model on the CPU backend and on wgpu
# (lavapipe where there is no GPU), and the browser demo end to end in headless Chromium.
# Fetches the model and installs what the demo needs when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

step() { echo "== $* ($(date +%T))" >&2; }

step "format"
cargo fmt --all -- --check

step "web demo: wasm32 build in the background (it fills the cores the native build leaves idle)"
mkdir -p target
web_log=target/web-demo-build.log
nice -n 10 scripts/web-demo.sh build >"$web_log" 2>&1 &
web_build=$!

step "fetch the default model if missing"
cargo run --release -q -p fornax -- fetch

step "the openai Python client (used by the server test) if missing"
# Installed into the cache with --target, so no virtual environment is needed.
export FORNAX_PYTHONPATH="${FORNAX_HOME:-$HOME/.cache/fornax}/python"
if ! PYTHONPATH="$FORNAX_PYTHONPATH" python3 -c "import openai" 2>/dev/null; then
    python3 -m pip install -q --disable-pip-version-check --no-warn-conflicts --target "$FORNAX_PYTHONPATH" "openai==3.57.0" ||
        python3 -m pip install -q --disable-pip-version-check --no-warn-conflicts --break-system-packages \
            --target "$FORNAX_PYTHONPATH" "openai==3.57.0"
fi

step "tests"
cargo test --release --workspace

step "web demo: the same greedy tokens in headless Chromium"
wait "$web_build" || { cat "$web_log" >&2; echo "web demo build failed" >&2; exit 1; }
scripts/web-demo.sh test

step "clippy, with the CUDA backend compiled in"
# cudarc cannot ask nvcc for the version here; pin the CUDA 12.8 API.
CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-12080}" \
    cargo clippy --release --workspace --all-targets --features fornax/cuda -- -D warnings

step "done"
