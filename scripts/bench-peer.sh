#!/usr/bin/env bash
# Fornax against llama.cpp on the same GGUF with the same thread count, run alternately
# (A B A B, ROUNDS rounds) so both see the same machine load. llama.cpp is the prebuilt
# CPU binary inside the npm package node-llama-cpp@3.21.1, installed into the cache when
# missing (nothing is compiled). Prints one table: each engine's median and the ratio
# Fornax / llama.cpp, with the CPU model and the date. A benchmark, not a test.
#
# usage: scripts/bench-peer.sh [--model PATH|ALIAS]   (env: ROUNDS=3, THREADS=all cores)
#   default: the default model; an alias (`fornax models`) is fetched into the cache.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
ROUNDS="${ROUNDS:-3}"
THREADS="${THREADS:-$(nproc)}"

cargo build --release -q -p fornax
FORNAX=target/release/fornax
ARG=""
while [ $# -gt 0 ]; do
    case "$1" in
        --model) ARG="${2:?--model needs a path or an alias}"; shift 2 ;;
        *) ARG="$1"; shift ;;
    esac
done
if [ -z "$ARG" ]; then
    MODEL="$($FORNAX fetch)"
elif [ -f "$ARG" ]; then
    MODEL="$ARG"
else
    MODEL="$($FORNAX fetch "$ARG")"
fi
source scripts/peer/install.sh

# name | prompt tokens | decoded tokens | sequences | figure
CASES=(
    "prefill 128|128|1|1|prefill_tok_s"
    "prefill 512|512|1|1|prefill_tok_s"
    "decode, batch 1 (128 tokens)|32|128|1|decode_tok_s"
    "decode, 8 sequences (aggregate)|32|32|8|decode_tok_s"
    "decode, 32 sequences (aggregate)|32|32|32|decode_tok_s"
)
RESULTS="$(mktemp)"
trap 'rm -f "$RESULTS"' EXIT
for round in $(seq "$ROUNDS"); do
    for case in "${CASES[@]}"; do
        IFS='|' read -r name p g s figure <<<"$case"
        echo "bench-peer: round $round/$ROUNDS, $name" >&2
        f=$($FORNAX bench case --backend cpu --threads "$THREADS" --model "$MODEL" \
            --prompt-tokens "$p" --gen-tokens "$g" --sequences "$s" 2>/dev/null)
        l=$(node "$PEER/llama-case.mjs" "$MODEL" "$THREADS" "$p" "$g" "$s" 2>/dev/null)
        printf '%s\t%s\t%s\n' "$name" "$figure" "$f" "$name" "$figure" "$l" >>"$RESULTS"
    done
done

python3 - "$RESULTS" "$ROUNDS" "$THREADS" "$MODEL" <<'PY'
import json, statistics, sys, platform, datetime, os
path, rounds, threads, model = sys.argv[1:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
rows = {}
for line in open(path):
    name, figure, js = line.rstrip("\n").split("\t")
    r = json.loads(js)
    rows.setdefault(name, {}).setdefault(r["engine"], []).append(r[figure])
print(f"Fornax vs llama.cpp (node-llama-cpp 3.21.1), {os.path.basename(model)}, {threads} threads, "
      f"median of {rounds} alternated rounds | {cpu} | {datetime.date.today()}")
print("| case | Fornax tok/s | llama.cpp tok/s | Fornax / llama.cpp |")
print("|---|---|---|---|")
for name, by in rows.items():
    f, l = statistics.median(by["fornax"]), statistics.median(by["llama.cpp"])
    print(f"| {name} | {f:.1f} | {l:.1f} | {f / l:.2f}x |")
PY
