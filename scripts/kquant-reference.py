#!/usr/bin/env python3
"""Writes tests/reference/quant_blocks.json: random blocks of every block format Fornax
reads and their values as the `gguf` Python package (llama.cpp's own reader) dequantizes
them, the reference for the GGUF reader's dequantization and the kernels tested against it.

    python3 -m pip install gguf==0.17.1 numpy==2.4.6
    python3 scripts/kquant-reference.py
"""
import json
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

# Byte offsets of each format's IEEE-half scales: set to sane values, the rest is random.
HALVES = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
BLOCKS = 3


def main():
    rng = np.random.default_rng(20261204)
    out = {"gguf": "0.17.1", "formats": []}
    for qtype, halves in HALVES.items():
        _, block_bytes = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(BLOCKS, block_bytes), dtype=np.uint8)
        for b in range(BLOCKS):
            for at in halves:
                value = np.float16(rng.uniform(0.001, 0.05) * rng.choice([-1, 1]))
                raw[b, at : at + 2] = np.frombuffer(value.tobytes(), dtype=np.uint8)
        values = dequantize(raw.reshape(-1), qtype).reshape(-1)
        out["formats"].append(
            {
                "type": qtype.name,
                "bytes": raw.reshape(-1).tobytes().hex(),
                "values": [float(v) for v in values.astype(np.float32)],
            }
        )
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "reference", "quant_blocks.json")
    with open(path, "w") as f:
        json.dump(out, f)
    print(f"wrote {path}: {len(out['formats'])} formats, {BLOCKS} blocks each")


if __name__ == "__main__":
    main()
