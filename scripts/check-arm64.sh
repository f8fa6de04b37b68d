#!/usr/bin/env bash
# The arm64 kernels (NEON, NEON with `sdot`) checked on an x86 machine: fornax-cpu's
# `levels_agree` example cross-built for aarch64 and run under qemu, once on a CPU with
# the dot-product extension and once without. Every level must give the portable level's
# results exactly. Not part of the test command; installs what it needs when missing:
# Debian's rustc-web and rust-web-src (std built for the target), the aarch64 cross
# linker and qemu-user.
#
# usage: scripts/check-arm64.sh
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
/usr/bin/rustc --version 2>/dev/null | grep -q '^rustc 1\.9[6-9]' || missing+=(rustc-web cargo-web)
[ -d /usr/lib/rustlib/src/rust/library ] || missing+=(rust-web-src)
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    echo "check-arm64: installing ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

TARGET_DIR="${FORNAX_ARM64_TARGET:-$PWD/target/arm64}"
# rustup's proxies would pick the pinned toolchain: call Debian's explicitly.
RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="$TARGET_DIR" \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    /usr/bin/cargo build --release --locked -Zbuild-std=std,panic_abort \
    --target aarch64-unknown-linux-gnu -p fornax-cpu --example levels_agree
BIN="$TARGET_DIR/aarch64-unknown-linux-gnu/release/examples/levels_agree"
for cpu in max cortex-a57; do
    echo "check-arm64: qemu-aarch64 -cpu $cpu" >&2
    qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu "$cpu" "$BIN"
done
