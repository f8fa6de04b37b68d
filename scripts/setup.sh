#!/usr/bin/env bash
# Sourced by run.sh and test.sh: installs what Fornax needs on a fresh Debian machine
# (Mesa's Vulkan drivers, which include the lavapipe software adapter) and sets the
# environment. Idempotent: installs nothing that is already there.
set -euo pipefail

missing=()
compgen -G "/usr/share/vulkan/icd.d/*.json" >/dev/null || missing+=(mesa-vulkan-drivers)
ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1' || missing+=(libvulkan1)
# The tests of the shared KV tier start a redis-server of their own (FORNAX_SETUP_TESTS=1
# from scripts/test.sh); `fornax serve` itself needs none.
if [ "${FORNAX_SETUP_TESTS:-0}" = 1 ]; then
    command -v redis-server >/dev/null || missing+=(redis-server)
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "setup: cargo is needed (https://rustup.rs)" >&2; exit 1; }

# Mesa warns when this is unset; harmless but noisy.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
