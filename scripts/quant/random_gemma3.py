#!/usr/bin/env python3
"""Writes a random-weight GGUF of Gemma-3-1B's shape (26 layers, hidden 1152, FFN 6912, 4 heads
over 1 KV head of 256, vocabulary 262,144, tied embeddings, a sliding window of 512 on five
layers of six, RoPE bases 1e6 / 1e4) in F16, as llama.cpp's converter lays Gemma 3 out: a speed
and parity test at a real shape (the values do not change the work). Its vocabulary is Llama 2's
SentencePiece pieces (fixtures/tokenizers/llama-spm.gguf) padded with unused tokens to Gemma's
size. Quantize it with llama-quantize.

    python3 scripts/quant/random_gemma3.py --out DIR/gemma3-1b-shape.F16.gguf [--untied]

--untied adds an output layer of unit-scale rows, so that teacher-forced logits have the
margins of a trained model (a tied random embedding gives near-ties everywhere).
"""
import argparse
import os

import gguf
import numpy as np
from tokenizer import write

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
S = dict(layers=26, hidden=1152, ffn=6912, heads=4, kv_heads=1, head_dim=256, vocab=262144, ctx=32768,
         window=512, pattern=6)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--untied", action="store_true")
    a = ap.parse_args()
    r = gguf.GGUFReader(os.path.join(ROOT, "fixtures", "tokenizers", "llama-spm.gguf"))
    f = r.fields
    tokens = list(f["tokenizer.ggml.tokens"].contents())
    scores = list(f["tokenizer.ggml.scores"].contents())
    types = list(f["tokenizer.ggml.token_type"].contents())
    pad = S["vocab"] - len(tokens)
    tokens += [f"<unused{i}>" for i in range(pad)]
    scores += [0.0] * pad
    types += [5] * pad
    w = gguf.GGUFWriter(a.out, "gemma3")
    w.add_name("random-weight Gemma-3-1B shape")
    w.add_block_count(S["layers"])
    w.add_context_length(S["ctx"])
    w.add_embedding_length(S["hidden"])
    w.add_feed_forward_length(S["ffn"])
    w.add_head_count(S["heads"])
    w.add_head_count_kv(S["kv_heads"])
    w.add_key_length(S["head_dim"])
    w.add_value_length(S["head_dim"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1_000_000.0)
    w.add_sliding_window(S["window"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_add_space_prefix(False)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    rng = np.random.default_rng(a.seed)
    h, ffn, hd = S["hidden"], S["ffn"], S["head_dim"]

    def rand(*shape, std=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float16)

    def norm(n):  # stored as 1 + w, as the converter writes Gemma norms
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    w.add_tensor("token_embd.weight", rand(S["vocab"], h))
    if a.untied:
        w.add_tensor("output.weight", rand(S["vocab"], h, std=1.0))
    w.add_tensor("output_norm.weight", norm(h))
    for i in range(S["layers"]):
        p = f"blk.{i}."
        for n in ["attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"]:
            w.add_tensor(p + n + ".weight", norm(h))
        w.add_tensor(p + "attn_q_norm.weight", norm(hd))
        w.add_tensor(p + "attn_k_norm.weight", norm(hd))
        w.add_tensor(p + "attn_q.weight", rand(S["heads"] * hd, h))
        w.add_tensor(p + "attn_k.weight", rand(S["kv_heads"] * hd, h))
        w.add_tensor(p + "attn_v.weight", rand(S["kv_heads"] * hd, h))
        w.add_tensor(p + "attn_output.weight", rand(h, S["heads"] * hd))
        w.add_tensor(p + "ffn_gate.weight", rand(ffn, h))
        w.add_tensor(p + "ffn_up.weight", rand(ffn, h))
        w.add_tensor(p + "ffn_down.weight", rand(h, ffn))
    write(w)


if __name__ == "__main__":
    main()
