# Sourced by the benchmark scripts that run llama.cpp beside Fornax: installs the npm
# package node-llama-cpp@3.21.1 (its prebuilt CPU binary is the peer; nothing is compiled
# and nothing else is downloaded) into $PEER when missing, and puts our driver scripts
# next to it, where ES modules resolve the package. Sets PEER.
PEER="${FORNAX_HOME:-$HOME/.cache/fornax}/llama.cpp"
if [ ! -d "$PEER/node_modules/node-llama-cpp" ]; then
    command -v npm >/dev/null || { echo "peer: npm is needed (apt-get install npm)" >&2; exit 1; }
    echo "peer: installing node-llama-cpp@3.21.1 into $PEER" >&2
    mkdir -p "$PEER"
    # --ignore-scripts: its postinstall would offer to build llama.cpp; the prebuilt
    # binaries come inside the package.
    npm install --prefix "$PEER" --no-audit --no-fund --ignore-scripts node-llama-cpp@3.21.1 >&2
fi
cp scripts/peer/*.mjs "$PEER/"
