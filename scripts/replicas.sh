#!/usr/bin/env bash
# N `fornax serve` replicas on loopback ports sharing their KV prefix blocks through one
# redis-server (Debian's package, installed when missing, bound to 127.0.0.1). Put them
# behind a proxy (docs/operations.md, "Replicas"). Stops everything on Ctrl-C.
#
# usage: scripts/replicas.sh N [fornax serve flags...]
#   env: BASE_PORT=8081 (replica i listens on BASE_PORT + i - 1), REDIS_PORT=6379,
#        REDIS_MAXMEMORY=1gb (Redis evicts least recently used blocks beyond it)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
N="${1:?usage: scripts/replicas.sh N [fornax serve flags...]}"
shift
BASE_PORT="${BASE_PORT:-8081}"
REDIS_PORT="${REDIS_PORT:-6379}"
REDIS_MAXMEMORY="${REDIS_MAXMEMORY:-1gb}"

if ! command -v redis-server >/dev/null; then
    echo "replicas: installing redis-server" >&2
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends redis-server >/dev/null
fi
cargo build --release -q -p fornax
FORNAX=target/release/fornax
MODEL="$($FORNAX fetch)"

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait' EXIT INT TERM
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --maxmemory "$REDIS_MAXMEMORY" --maxmemory-policy allkeys-lru >/dev/null &
pids+=($!)
for i in $(seq "$N"); do
    port=$((BASE_PORT + i - 1))
    $FORNAX serve --model "$MODEL" --host 127.0.0.1 --port "$port" \
        --kv-remote "redis://127.0.0.1:$REDIS_PORT/" "$@" &
    pids+=($!)
done
echo "replicas: $N servers on 127.0.0.1:$BASE_PORT..$((BASE_PORT + N - 1)), Redis on 127.0.0.1:$REDIS_PORT (maxmemory $REDIS_MAXMEMORY, allkeys-lru)" >&2
wait
