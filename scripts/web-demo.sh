#!/usr/bin/env bash
# The browser demo (web-demo/). Installs what it needs when missing: Debian's rustc-web
# (builds std for wasm32), wasm-bindgen-cli, Chromium and playwright-core.
#
#   scripts/web-demo.sh build   # both modules' wasm + JS glue + page into target/web-demo/site
#   scripts/web-demo.sh serve   # build, then serve it with the picker's models on http://127.0.0.1:8080
#   scripts/web-demo.sh test    # build, then the end-to-end test in headless Chromium
#   scripts/web-demo.sh bench   # build, then the CPU path against wllama (scripts/bench-browser.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

WASM_BINDGEN_VERSION=0.2.130 # = the wasm-bindgen pinned in web-demo/Cargo.toml
PLAYWRIGHT_VERSION=1.65.1
WLLAMA_VERSION=3.13.0 # the browser CPU path's peer (npm @wllama/wllama)
FORNAX_HOME="${FORNAX_HOME:-$HOME/.cache/fornax}"
SITE=target/web-demo/site
# Its own target dir: another compiler, and std is rebuilt in every fresh one.
WASM_TARGET="${FORNAX_WASM_TARGET:-$PWD/target/wasm}"
WASM_THREADS_TARGET="${FORNAX_WASM_THREADS_TARGET:-$PWD/target/wasm-threads}"
NODE_DIR="$FORNAX_HOME/node"

step() { echo "== web-demo: $* ($(date +%T))" >&2; }

apt_install() {
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    echo "web-demo: installing $*" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

toolchain() {
    # rustup has no wasm32 std here: Debian's rustc-web builds it from its own sources.
    local missing=()
    [ -x /usr/bin/rustc ] && /usr/bin/rustc --version | grep -q '^rustc 1\.9[6-9]' || missing+=(rustc-web cargo-web)
    [ -d /usr/lib/rustlib/src/rust/library ] || missing+=(rust-web-src)
    dpkg -s rust-web-llvm >/dev/null 2>&1 || missing+=(rust-web-llvm)
    command -v ld.lld-22 >/dev/null || missing+=(lld-22) # rust-lld links to it
    [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
    if [ "$(wasm-bindgen --version 2>/dev/null)" != "wasm-bindgen $WASM_BINDGEN_VERSION" ]; then
        step "install wasm-bindgen-cli $WASM_BINDGEN_VERSION"
        # Not --locked: one of its locked dependencies is gone from the index. --force: cargo
        # skips a crate it has recorded as installed even when the binary is gone. Only the
        # wasm-bindgen binary, without TLS (its test runner's downloads need it; ring is
        # heavy), unoptimised: 161 CPU-s to compile instead of 458, and it still processes
        # the module in 9 s (docs/ci.md, "What keeps a cold run short").
        CARGO_PROFILE_RELEASE_OPT_LEVEL=0 CARGO_PROFILE_RELEASE_CODEGEN_UNITS=256 \
            CARGO_PROFILE_RELEASE_LTO=false \
            cargo install -q --force wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION" \
            --no-default-features --bin wasm-bindgen
    fi
}

# One module: `module DIR TARGET_DIR RUSTFLAGS CARGO_ARGS...` builds fornax-web for wasm32
# and writes its JS glue into $SITE/DIR.
module() {
    local dir=$1 target=$2 flags=$3
    shift 3
    step "build fornax-web for wasm32 into $dir"
    # rustup's proxies would pick the pinned toolchain: call Debian's explicitly.
    RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="$target" \
        RUSTFLAGS="$flags" \
        /usr/bin/cargo build --profile web --locked -Zbuild-std=std,panic_abort \
        --target wasm32-unknown-unknown -p fornax-web "$@"
    local wasm="$target/wasm32-unknown-unknown/web/fornax_web.wasm"
    # `test` builds again after CI's background build: the glue is kept when it is newer
    # than the module it was made from.
    if [ ! "$SITE/$dir/fornax_web_bg.wasm" -nt "$wasm" ]; then
        step "JS glue for $dir"
        rm -rf "${SITE:?}/$dir"
        wasm-bindgen --target web --remove-name-section --remove-producers-section \
            --out-dir "$SITE/$dir" "$wasm"
    fi
    echo "web-demo: $SITE/$dir ($(du -h "$SITE/$dir/fornax_web_bg.wasm" | cut -f1) of wasm)" >&2
}

# Both modules, each in its own target dir (another compiler and other flags; std is
# rebuilt in every fresh one), one after the other (each uses every core it gets):
# - pkg: WebGPU, and the CPU path on one thread (for pages that are not cross-origin
#   isolated); WebAssembly SIMD in both.
# - pkg-threads: the CPU path only, on a pool of Web Workers over shared memory (atomics;
#   wgpu's WebGPU objects cannot be shared between threads, so no WebGPU in it). Up to
#   4 GiB of memory, shared: linked as wasm-bindgen's threads expect (memory imported,
#   the TLS symbols exported).
THREADS_LINK="-C link-arg=--shared-memory -C link-arg=--import-memory -C link-arg=--max-memory=4294967296"
THREADS_LINK+=" -C link-arg=--export=__wasm_init_tls -C link-arg=--export=__tls_size"
THREADS_LINK+=" -C link-arg=--export=__tls_align -C link-arg=--export=__tls_base"
build() {
    toolchain
    mkdir -p "$SITE"
    module pkg "$WASM_TARGET" "${WASM_RUSTFLAGS:--C target-feature=+simd128}"
    module pkg-threads "$WASM_THREADS_TARGET" \
        "-C target-feature=+simd128,+atomics,+bulk-memory,+mutable-globals $THREADS_LINK" \
        --no-default-features --features threads
    cp web-demo/www/* "$SITE/"
}

# The site with the picker's models beside it (fetched into the cache once), so the page
# can load them by URL.
with_model() {
    cargo run --release -q -p fornax -- fetch
    cargo run --release -q -p fornax -- fetch gemma3-270m
    mkdir -p "$SITE/models"
    ln -sf "$FORNAX_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf" "$SITE/models/"
    ln -sf "$FORNAX_HOME/models/gemma-3-270m-q4_k_m.gguf" "$SITE/models/"
}

browser() {
    command -v chromium >/dev/null || apt_install chromium
    if [ ! -f "$NODE_DIR/node_modules/playwright-core/package.json" ] ||
        ! grep -q "\"version\": \"$PLAYWRIGHT_VERSION\"" "$NODE_DIR/node_modules/playwright-core/package.json"; then
        command -v npm >/dev/null || apt_install nodejs npm
        mkdir -p "$NODE_DIR"
        npm install -s --prefix "$NODE_DIR" --no-audit --no-fund "playwright-core@$PLAYWRIGHT_VERSION"
    fi
}

command=${1:-}
shift || true
case "$command" in
build) build ;;
serve)
    build
    with_model
    node web-demo/serve.mjs "$SITE" "${PORT:-8080}"
    ;;
test)
    build
    with_model
    browser
    step "native greedy tokens"
    prompt="The capital of France is"
    schema=web-demo/tests/schema.json
    fornax() { cargo run --release -q -p fornax -- "$@"; }
    # Each path's expectations from the native engine on the same backend: greedy ids,
    # ids under the schema, and the picked model's first ids (one on WebGPU, whose
    # software adapter takes seconds a token; eight on the CPU).
    expect() {
        local backend=$1 picked=$2 native constrained gemma
        native=$(fornax generate "$prompt" --max-tokens 8 --json --backend "$backend")
        constrained=$(fornax generate "$prompt" --json-schema "$schema" --max-tokens 24 --json --backend "$backend")
        gemma=$(fornax generate "$prompt" --model gemma3-270m --max-tokens "$picked" --json --backend "$backend")
        echo "native on $backend: $native; under $schema: $constrained; Gemma 3: $gemma" >&2
        python3 -c 'import json,sys; ids=[json.loads(a)["generated_ids"] for a in sys.argv[1:]]; print(json.dumps(dict(zip(["ids","schema","picked"],ids))))' \
            "$native" "$constrained" "$gemma"
    }
    webgpu=$(expect wgpu 1)
    cpu=$(expect cpu 8)
    step "headless Chromium"
    out="${FORNAX_TEST_OUT:-target/test-output/web-demo}"
    mkdir -p "$out"
    NODE_PATH="$NODE_DIR/node_modules" node web-demo/tests/e2e.mjs \
        --site "$SITE" --model models/SmolLM2-135M-Instruct.Q4_1.gguf --prompt "$prompt" \
        --schema "$(cat "$schema")" --picked models/gemma-3-270m-q4_k_m.gguf \
        --expect-webgpu "$webgpu" --expect-cpu "$cpu" --out "$out"
    ;;
bench)
    build
    with_model >&2
    browser
    # wllama beside the site, served from the same origin (its threads need isolation too).
    if ! grep -q "\"version\": \"$WLLAMA_VERSION\"" "$NODE_DIR/node_modules/@wllama/wllama/package.json" 2>/dev/null; then
        npm install -s --prefix "$NODE_DIR" --no-audit --no-fund "@wllama/wllama@$WLLAMA_VERSION"
    fi
    mkdir -p "$SITE/bench/wllama"
    cp web-demo/bench/wllama.html web-demo/bench/wllama.js "$SITE/bench/"
    rm -rf "$SITE/bench/wllama/esm"
    cp -r "$NODE_DIR/node_modules/@wllama/wllama/esm" "$SITE/bench/wllama/"
    step "Fornax's CPU path against wllama $WLLAMA_VERSION in headless Chromium"
    NODE_PATH="$NODE_DIR/node_modules" node web-demo/bench/bench.mjs \
        --site "$SITE" --model models/SmolLM2-135M-Instruct.Q4_1.gguf "$@"
    ;;
*)
    echo "usage: scripts/web-demo.sh build|serve|test|bench" >&2
    exit 2
    ;;
esac
