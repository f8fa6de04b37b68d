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

install_python() {
    # Installed into the cache with --target, so no virtual environment is needed.
    local packages=("openai==3.57.0" "jsonschema==4.26.0")
    if ! PYTHONPATH="$FORNAX_PYTHONPATH" python3 -c "import openai, jsonschema" 2>/dev/null; then
        python3 -m pip install -q --disable-pip-version-check --no-warn-conflicts --target "$FORNAX_PYTHONPATH" "${packages[@]}" ||
            python3 -m pip install -q --disable-pip-version-check --no-warn-conflicts --break-system-packages \
                --target "$FORNAX_PYTHONPATH" "${packages[@]}"
    fi
}
export FORNAX_PYTHONPATH="${FORNAX_HOME:-$HOME/.cache/fornax}/python"
phase "the openai client and jsonschema (server and structured-output tests)" install_python

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
