#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on a GPU machine into .gpu/ (ignored by git), for
# the device tool, which sends at most 64 MiB a call with the working tree: the model
# (98 MB) goes in two calls. `.gpu/1` holds the model's first 60 MiB; `.gpu/2` the rest,
# the CUDA build of fornax (stripped, xz) and their sha256 sums. On the GPU machine,
# `scripts/gpu-device.sh` puts them back together and runs the checks (DEVELOPERS.md,
# "On a GPU machine").
# Usage: scripts/gpu-pack.sh   (CUDARC_CUDA_VERSION: the machine's CUDA, default 13000)
set -euo pipefail
cd "$(dirname "$0")/.."
export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-13000}"
cargo build --release -p fornax --features cuda
model=$(target/release/fornax fetch)
rm -rf .gpu
mkdir -p .gpu/1 .gpu/2
first=$((60 * 1024 * 1024))
head -c "$first" "$model" >.gpu/1/model.part
tail -c "+$((first + 1))" "$model" >.gpu/2/model.part
strip -o .gpu/fornax target/release/fornax
(cd .gpu && sha256sum fornax >2/SHA256SUMS && sha256sum "$model" | sed 's|  .*|  model.gguf|' >>2/SHA256SUMS)
xz -9 -T0 .gpu/fornax
mv .gpu/fornax.xz .gpu/2/
du -b .gpu/1 .gpu/2 | sed 's/^/packed: /' >&2
