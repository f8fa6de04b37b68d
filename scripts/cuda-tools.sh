#!/usr/bin/env bash
# Installs the CUDA tools the kernel check needs (`fornax kernels`, the test command):
# NVRTC, ptxas and the CUDA runtime headers from NVIDIA's PyPI wheels, pinned to CUDA 12.8,
# the version cudarc is built for. No driver and no GPU needed. Into $FORNAX_CUDA_TOOLS,
# else cuda-tools in the model cache's folder; does nothing when they are there.
set -euo pipefail
dir="${FORNAX_CUDA_TOOLS:-${FORNAX_HOME:-$HOME/.cache/fornax}/cuda-tools}"
packages=(nvidia-cuda-nvrtc-cu12==12.8.93 nvidia-cuda-nvcc-cu12==12.8.93 nvidia-cuda-runtime-cu12==12.8.90)
stamp="$dir/.installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${packages[*]}" ]; then
    exit 0
fi
echo "cuda-tools: installing ${packages[*]} into $dir" >&2
rm -rf "$dir"
source "$(dirname "$0")/pip-target.sh"
pip_target "$dir" --no-deps "${packages[@]}"
echo "${packages[*]}" >"$stamp"
