#!/usr/bin/env bash
# The browser demo (web-demo/). Installs what it needs when missing: Debian's rustc-web
# (builds std for wasm32), wasm-bindgen-cli, Chromium and playwright-core.
#
#   scripts/web-demo.sh build   # wasm + JS glue + page into target/web-demo/site
#   scripts/web-demo.sh serve   # build, then serve it with the picker's models on http://127.0.0.1:8080
#   scripts/web-demo.sh test    # build, then the end-to-end test in headless Chromium
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

WASM_BINDGEN_VERSION=0.2.130 # = the wasm-bindgen pinned in web-demo/Cargo.toml
PLAYWRIGHT_VERSION=1.65.1
FORNAX_HOME="${FORNAX_HOME:-$HOME/.cache/fornax}"
SITE=target/web-demo/site
# Its own target dir: another compiler, and std is rebuilt in every fresh one.
WASM_TARGET="${FORNAX_WASM_TARGET:-$PWD/target/wasm}"
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

build() {
    toolchain
    step "build fornax-web for wasm32"
    # rustup's proxies would pick the pinned toolchain: call Debian's explicitly.
    RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="$WASM_TARGET" \
        RUSTFLAGS="${WASM_RUSTFLAGS:-}" \
        /usr/bin/cargo build --profile web --locked -Zbuild-std=std,panic_abort \
        --target wasm32-unknown-unknown -p fornax-web
    local module="$WASM_TARGET/wasm32-unknown-unknown/web/fornax_web.wasm"
    # `test` builds again after CI's background build: the glue is kept when it is newer
    # than the module it was made from.
    if [ ! "$SITE/pkg/fornax_web_bg.wasm" -nt "$module" ]; then
        step "JS glue"
        rm -rf "$SITE"
        mkdir -p "$SITE"
        wasm-bindgen --target web --remove-name-section --remove-producers-section \
            --out-dir "$SITE/pkg" "$module"
    fi
    cp web-demo/www/* "$SITE/"
    echo "web-demo: $SITE ($(du -h "$SITE/pkg/fornax_web_bg.wasm" | cut -f1) of wasm)" >&2
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

case "${1:-}" in
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
    native=$(cargo run --release -q -p fornax -- generate "$prompt" --max-tokens 8 --json --backend wgpu)
    echo "native: $native" >&2
    schema=web-demo/tests/schema.json
    constrained=$(cargo run --release -q -p fornax -- generate "$prompt" --json-schema "$schema" --max-tokens 24 --json --backend wgpu)
    echo "native under $schema: $constrained" >&2
    gemma=$(cargo run --release -q -p fornax -- generate "$prompt" --model gemma3-270m --max-tokens 1 --json --backend wgpu)
    echo "native Gemma 3: $gemma" >&2
    ids() { python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["generated_ids"]))'; }
    step "headless Chromium"
    out="${FORNAX_TEST_OUT:-target/test-output/web-demo}"
    mkdir -p "$out"
    NODE_PATH="$NODE_DIR/node_modules" node web-demo/tests/e2e.mjs \
        --site "$SITE" --model models/SmolLM2-135M-Instruct.Q4_1.gguf --prompt "$prompt" \
        --expect "$(ids <<<"$native")" \
        --schema "$(cat "$schema")" --schema-expect "$(ids <<<"$constrained")" \
        --picked models/gemma-3-270m-q4_k_m.gguf --picked-expect "$(ids <<<"$gemma")" \
        --out "$out"
    ;;
*)
    echo "usage: scripts/web-demo.sh build|serve|test" >&2
    exit 2
    ;;
esac
