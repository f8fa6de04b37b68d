#!/usr/bin/env bash
# CUDA checks on a machine with an NVIDIA GPU, given a fornax binary built with
# `--features cuda` and the default model. In order of what matters most, each step under
# its own time limit and skipped once the whole budget is spent:
# - greedy tokens of the reference prompts against the float reference (through the paged
#   KV cache, our attention kernels and the fused layers);
# - `bench single`: the fused kernels, the same quantized weights operation by operation
#   and FP32 weights side by side, with dispatches and syncs per decoded token, in FP16
#   (`--dtype auto`, CUDA's default) and in FP32;
# - the aggregate decode rate of 64 sequences (`bench case`: fused in FP16 and in FP32,
#   and `--reference-ops`);
# - perplexity of the reference text over the paged cache in FP16 and in FP32, the
#   contiguous cache, FP32 weights (`--dequantize`) and `--reference-ops`;
# - `bench kv`, `bench load` and `bench table` (before/after at GPU sizes, plots in
#   OUT_DIR/bench);
# - outside the budget, the kernel table: every CUDA kernel the steps compiled (cubecl logs
#   their source to OUT_DIR/kernels.log through a `cubecl.toml` here), assembled with
#   `nvcc -Xptxas -v` for sm_80 and sm_90a: registers, shared memory, spills, occupancy
#   (scripts/cuda-kernels.py).
# Each step's output goes to OUT_DIR/NAME.txt and a line of its wall time to
# OUT_DIR/steps.txt.
# Usage: scripts/gpu-check.sh FORNAX_BINARY MODEL.gguf [OUT_DIR]
# Environment: GPU_CHECK_BUDGET_S (default 420): no step starts after this many seconds;
# BACKEND (default cuda): rehearse the script on `cpu` or `wgpu` where there is no GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$1 model=$2 out=${3:-.}
budget=${GPU_CHECK_BUDGET_S:-420}
backend=${BACKEND:-cuda}
ref=tests/reference
mkdir -p "$out"
: >"$out/steps.txt"
started=$SECONDS
if [ "$backend" = cuda ] && [ ! -e cubecl.toml ]; then
    printf '[compilation.logger]\nlevel = "full"\nfile = "%s"\n' "$(realpath "$out")/kernels.log" >cubecl.toml
    trap 'rm -f cubecl.toml' EXIT
fi

# `step NAME LIMIT_S COMMAND...`: runs COMMAND under LIMIT_S seconds (never past the
# budget), its output to the console and OUT_DIR/NAME.txt, and records how it went.
step() {
    local name=$1 limit=$2 t0=$SECONDS rc left
    shift 2
    left=$((budget - (SECONDS - started)))
    if [ "$left" -le 0 ]; then
        echo "$name: skipped (budget spent)" | tee -a "$out/steps.txt"
        return
    fi
    [ "$limit" -le "$left" ] || limit=$left
    echo "== $name (limit ${limit} s)"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.txt"
    rc=${PIPESTATUS[0]}
    echo "$name: $((SECONDS - t0)) s, exit $rc$([ "$rc" = 124 ] && echo ' (time limit)')" | tee -a "$out/steps.txt"
}

greedy() {
    python3 - "$ref/prompts.json" >"$out/prompts.txt" <<'PY'
import json, sys
for p in json.load(open(sys.argv[1]))["prompts"]:
    print(p["prompt"])
PY
    local i=0 prompt
    while IFS= read -r prompt; do
        "$bin" generate "$prompt" --max-tokens 32 --ignore-eos --json --backend "$backend" \
            --model "$model" >"$out/greedy_$i.json"
        i=$((i + 1))
    done <"$out/prompts.txt"
    python3 - "$ref/prompts.json" "$out" <<'PY'
import json, sys
ref = json.load(open(sys.argv[1]))["prompts"]
for i, p in enumerate(ref):
    ours = json.load(open(f"{sys.argv[2]}/greedy_{i}.json"))
    want = p["float_reference"]["greedy_ids"]
    same = next((k for k, (a, b) in enumerate(zip(ours["generated_ids"], want)) if a != b), len(want))
    margin = p["float_reference"]["steps"][same]["margin_top1_top2_logit"] if same < len(want) else None
    print(f"{p['prompt']!r}: prompt ids equal: {ours['prompt_ids'] == p['prompt_ids']}, "
          f"greedy tokens equal to the float reference: {same}/32"
          + ("" if margin is None else f" (reference margin at divergence {margin:.3f})"))
PY
}

export -f greedy
export bin model out ref backend
nvidia-smi -L || true
m=(--backend "$backend" --model "$model")
step info 120 "$bin" info "${m[@]}"
step greedy 180 bash -c greedy
step bench_single 180 "$bin" bench single "${m[@]}" --prompt-tokens 128 --gen-tokens 64 --runs 5
step bench_single_fp32 120 "$bin" bench single "${m[@]}" --prompt-tokens 128 --gen-tokens 64 \
    --runs 5 --dtype f32
step case_64_fused 120 "$bin" bench case "${m[@]}" --prompt-tokens 128 --gen-tokens 64 --sequences 64
step case_64_fp32 120 "$bin" bench case "${m[@]}" --prompt-tokens 128 --gen-tokens 64 \
    --sequences 64 --dtype f32
step case_64_reference 120 "$bin" bench case "${m[@]}" --prompt-tokens 128 --gen-tokens 64 \
    --sequences 64 --reference-ops
step perplexity 90 "$bin" perplexity "$ref/ppl_text.txt" "${m[@]}"
step perplexity_fp32 90 "$bin" perplexity "$ref/ppl_text.txt" "${m[@]}" --dtype f32
step perplexity_contiguous 90 "$bin" perplexity "$ref/ppl_text.txt" "${m[@]}" --contiguous-kv
step perplexity_fp32_weights 90 "$bin" perplexity "$ref/ppl_text.txt" "${m[@]}" --dequantize \
    --dtype f32
step perplexity_reference 90 "$bin" perplexity "$ref/ppl_text.txt" "${m[@]}" --reference-ops
step bench_kv 90 "$bin" bench kv "${m[@]}" --text "$ref/ppl_text.txt" --steps 32
step bench_load 120 "$bin" bench load "${m[@]}" --text "$ref/ppl_text.txt" --requests 64
# The before/after table at GPU sizes (128 chats on CUDA by default; no llama.cpp peer
# here: the machine has no npm); the plots go to $out/bench.
step bench_table 180 "$bin" bench table "${m[@]}" --output-tokens 32 96 --timeout-s 30 \
    --sweep 0.4 1.0 --plots "$out/bench"
if [ -s "$out/kernels.log" ]; then
    budget=$((SECONDS - started + 150))
    step kernel_table 150 python3 scripts/cuda-kernels.py "$out/kernels.log" --arch sm_80 \
        --arch sm_90a --out "$out/kernels" \
        --nvcc "${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
fi
echo "== steps ($((SECONDS - started)) s in all)"
cat "$out/steps.txt"
