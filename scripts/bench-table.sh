#!/usr/bin/env bash
# The before/after table of the seed's A/B test with llama.cpp as the peer, on the CPU
# backend of this machine: `fornax bench table` with the replay driver of
# node-llama-cpp@3.21.1 (installed into the cache when missing; nothing is compiled).
# Prints the machine and the date, then the table, the targets and the sweep, and writes
# the plots (default docs/bench/). A benchmark, not a test: about 15 minutes on 2 cores.
#
# usage: scripts/bench-table.sh [fornax bench table flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo build --release -q -p fornax
FORNAX=target/release/fornax
$FORNAX fetch >/dev/null
source scripts/peer/install.sh
cpu=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "machine: $cpu, $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB | $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "command: scripts/bench-table.sh $*"
$FORNAX bench table --backend cpu --peer "$PEER/llama-replay.mjs" "$@"
