#!/usr/bin/env bash
# The main job: a chat reply from the default model (SmolLM2-135M-Instruct Q4_1, fetched
# into ~/.cache/fornax on first use). Extra arguments go to `fornax generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
if [ $# -eq 0 ]; then
    set -- --chat "What is the capital of France? Answer in one sentence."
fi
exec cargo run --release -q -p fornax -- generate "$@"
