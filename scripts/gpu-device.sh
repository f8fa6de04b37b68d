#!/usr/bin/env bash
# Runs on the GPU machine, in the repository root, after two device calls have brought
# `.gpu/1` and then `.gpu/2` (scripts/gpu-pack.sh): joins the model, unpacks the CUDA build
# of fornax, checks both against their sha256 sums, runs scripts/gpu-check.sh and leaves
# in OUT_DIR its log and one archive of everything it wrote (the device tool returns at
# most 8 files).
# Usage: scripts/gpu-device.sh [OUT_DIR]   (default: $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:?give OUT_DIR or set OUT}}
work=${GPU_WORK:-/tmp/fornax-gpu}
for part in .gpu/1/model.part .gpu/2/model.part .gpu/2/fornax.xz .gpu/2/SHA256SUMS; do
    if [ ! -f "$part" ]; then
        echo "missing $part: bring .gpu/1, then .gpu/2, in two calls to the same machine (it is given back when idle)" >&2
        exit 3
    fi
done
mkdir -p "$work" "$out"
cat .gpu/1/model.part .gpu/2/model.part >"$work/model.gguf"
python3 -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' \
    .gpu/2/fornax.xz "$work/fornax"
chmod +x "$work/fornax"
(cd "$work" && sha256sum -c "$OLDPWD/.gpu/2/SHA256SUMS") || exit 4
FORNAX_HOME="$work/home" scripts/gpu-check.sh "$work/fornax" "$work/model.gguf" "$work/out" 2>&1 |
    tee "$out/gpu-check.log"
tar -czf "$out/gpu-check.tar.gz" -C "$work" out
