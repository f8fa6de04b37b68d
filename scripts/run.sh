#!/usr/bin/env bash
# The main job: a chat reply from the default model (SmolLM2-135M-Instruct Q4_1, fetched
# into ~/.cache/fornax on first use). Extra arguments go to `fornax generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
if [ $# -eq 0 ]; then
    set -- --chat "What is the capital of France? Answer in one sentence."
fi
# cargo's own lines show the build's progress, in a log too.
[ -x target/release/fornax ] ||
    echo "run: building fornax (release); the first build takes about 5-10 minutes on 2 cores" >&2
cargo build --release -p fornax
exec target/release/fornax generate "$@"
