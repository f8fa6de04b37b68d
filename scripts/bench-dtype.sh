#!/usr/bin/env bash
# FP16 against FP32 compute (`--dtype`) on one backend and model, run alternately
# (f32 f16 f32 f16, ROUNDS rounds) so both see the same machine load. A device's float type
# is set once per process, so each run is its own `fornax bench case`. Prints one table:
# each type's median and the ratio FP16 / FP32, with the adapter and the date. A
# benchmark, not a test.
#
# usage: scripts/bench-dtype.sh [--model PATH|ALIAS] [--backend wgpu|cuda]
#   (env: ROUNDS=3; default: the default model on wgpu)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
ROUNDS="${ROUNDS:-3}"

cargo build --release -q -p fornax
FORNAX=target/release/fornax
MODEL="" BACKEND=wgpu
while [ $# -gt 0 ]; do
    case "$1" in
        --model) MODEL="${2:?--model needs a path or an alias}"; shift 2 ;;
        --backend) BACKEND="${2:?--backend needs a name}"; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
MODEL="$($FORNAX fetch ${MODEL:+"$MODEL"})"

# name | prompt tokens | decoded tokens | sequences | figure
CASES=(
    "prefill 128|128|1|1|prefill_tok_s"
    "decode, batch 1|16|32|1|decode_tok_s"
    "decode, 8 sequences (aggregate)|16|16|8|decode_tok_s"
)
RESULTS="$(mktemp)"
trap 'rm -f "$RESULTS"' EXIT
# A first run of each type compiles its kernels (minutes on lavapipe): not measured.
for dtype in f32 f16; do
    $FORNAX bench case --backend "$BACKEND" --dtype "$dtype" --model "$MODEL" \
        --prompt-tokens 16 --gen-tokens 2 >/dev/null 2>&1
done
for round in $(seq "$ROUNDS"); do
    for case in "${CASES[@]}"; do
        IFS='|' read -r name p g s figure <<<"$case"
        for dtype in f32 f16; do
            echo "bench-dtype: round $round/$ROUNDS, $name, $dtype" >&2
            r=$($FORNAX bench case --backend "$BACKEND" --dtype "$dtype" --model "$MODEL" \
                --prompt-tokens "$p" --gen-tokens "$g" --sequences "$s" 2>/dev/null)
            printf '%s\t%s\t%s\n' "$name" "$figure" "$r" >>"$RESULTS"
        done
    done
done

python3 - "$RESULTS" "$ROUNDS" "$MODEL" <<'PY'
import json, statistics, sys, datetime, os
path, rounds, model = sys.argv[1:]
rows, adapter = {}, ""
for line in open(path):
    name, figure, js = line.rstrip("\n").split("\t")
    r = json.loads(js)
    adapter = r["adapter"]
    rows.setdefault(name, {}).setdefault(r["dtype"], []).append(r[figure])
print(f"FP16 vs FP32 compute, {os.path.basename(model)}, {adapter}, median of {rounds} "
      f"alternated rounds | {datetime.date.today()}")
print("| case | FP32 tok/s | FP16 tok/s | FP16 / FP32 |")
print("|---|---|---|---|")
for name, by in rows.items():
    a, b = statistics.median(by["f32"]), statistics.median(by["f16"])
    print(f"| {name} | {a:.2f} | {b:.2f} | {b / a:.2f}x |")
PY
