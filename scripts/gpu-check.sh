#!/usr/bin/env bash
# CUDA checks on a machine with an NVIDIA GPU, given a fornax binary built with
# `--features cuda` and the default model: greedy tokens of the reference prompts against
# the float reference (through the paged KV cache and our attention kernels), perplexity
# of the reference text over the paged and the contiguous cache and with FP32 weights
# (`--dequantize`; the default keeps Q4_1/Q8_0 weights quantized for our matmul kernels),
# `bench single` (the fused kernels, the same quantized weights operation by operation and
# FP32 weights side by side, with dispatches and syncs per decoded token), the aggregate
# decode rate of 64 sequences (`bench case`, fused and `--reference-ops`), `bench kv`,
# `bench load` and `bench table` (before/after at GPU sizes, plots in OUT_DIR/bench).
# Usage: scripts/gpu-check.sh FORNAX_BINARY MODEL.gguf [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$1 model=$2 out=${3:-.}
ref=tests/reference
nvidia-smi -L || true
"$bin" info --backend cuda --model "$model"
python3 - "$ref/prompts.json" > "$out/prompts.txt" <<'PY'
import json, sys
for p in json.load(open(sys.argv[1]))["prompts"]:
    print(p["prompt"])
PY
i=0
while IFS= read -r prompt; do
    "$bin" generate "$prompt" --max-tokens 32 --ignore-eos --json --backend cuda --model "$model" > "$out/greedy_$i.json"
    i=$((i + 1))
done < "$out/prompts.txt"
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
"$bin" perplexity "$ref/ppl_text.txt" --backend cuda --model "$model"
"$bin" perplexity "$ref/ppl_text.txt" --backend cuda --model "$model" --contiguous-kv
"$bin" perplexity "$ref/ppl_text.txt" --backend cuda --model "$model" --dequantize
"$bin" perplexity "$ref/ppl_text.txt" --backend cuda --model "$model" --reference-ops
"$bin" bench single --backend cuda --model "$model" --prompt-tokens 128 --gen-tokens 64 --runs 5
"$bin" bench case --backend cuda --model "$model" --prompt-tokens 128 --gen-tokens 64 --sequences 64
"$bin" bench case --backend cuda --model "$model" --prompt-tokens 128 --gen-tokens 64 --sequences 64 --reference-ops
"$bin" bench kv --backend cuda --model "$model" --text "$ref/ppl_text.txt" --steps 32
"$bin" bench load --backend cuda --model "$model" --text "$ref/ppl_text.txt" --requests 64
# The before/after table at GPU sizes (128 chats on CUDA by default; no llama.cpp peer
# here: the machine has no npm); the plots go to $out/bench.
"$bin" bench table --backend cuda --model "$model" --output-tokens 32 96 --timeout-s 30 \
    --sweep 0.4 1.0 --plots "$out/bench"
