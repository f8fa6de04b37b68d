#!/usr/bin/env bash
# The browser's CPU path against wllama (llama.cpp in WebAssembly, npm @wllama/wllama,
# pinned in scripts/web-demo.sh) in one headless Chromium, the engines alternated on the
# same GGUF file, threads, prompt and token count, then Fornax on WebGPU (on a GPU-less
# machine, SwiftShader) once; prints a Markdown table with the browser's version.
# Builds and installs what it needs (scripts/web-demo.sh).
#
#   scripts/bench-browser.sh [--threads N] [--tokens N] [--rounds N] [--prompt TEXT]
exec "$(dirname "$0")/web-demo.sh" bench "$@"
