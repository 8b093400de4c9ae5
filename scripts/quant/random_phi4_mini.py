#!/usr/bin/env python3
"""Writes a random-weight GGUF of Phi-4-mini's shape (32 layers, hidden 3072, FFN 8192 with gate
and up fused, 24 heads over 8 KV heads of 128, 96 of each head's dimensions rotated, LongRoPE
over them with an original context of 4,096, vocabulary 200,064, tied embeddings) in F16, laid
out as llama.cpp's converter writes Phi-3 (`attn_qkv`, double-height `ffn_up`,
`phi3.rope.dimension_count`, `rope_factors_short` / `_long`): a speed and parity test at a real
shape (the values do not change the work). The LongRoPE short and long factors are equal, so
both engines compute the same function whichever set their context picks. Its vocabulary is
SmolLM2's (with Phi-4-mini's `gpt-4o` split) padded with unused tokens to the real size.
Quantize it with llama-quantize.

    python3 scripts/quant/random_phi4_mini.py --src SmolLM2-135M-Instruct.Q4_1.gguf \
        --out DIR/phi4-mini-shape.F16.gguf [--untied] [--layers N]

--untied adds an output layer of unit-scale rows, so that teacher-forced logits have the
margins of a trained model (a tied random embedding gives near-ties everywhere).
"""
import argparse
import math

import gguf
import numpy as np
from tokenizer import copy_tokenizer, write

S = dict(layers=32, hidden=3072, ffn=8192, heads=24, kv_heads=8, head_dim=128, rotary=96, vocab=200064,
         ctx=131072, original=4096)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True, help="a SmolLM2 GGUF whose tokenizer the file takes")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=S["layers"])
    ap.add_argument("--untied", action="store_true")
    a = ap.parse_args()
    h, ffn, hd = S["hidden"], S["ffn"], S["head_dim"]
    r = gguf.GGUFReader(a.src)
    n_src = len(r.fields["tokenizer.ggml.tokens"].contents())
    w = gguf.GGUFWriter(a.out, "phi3")
    w.add_name("random-weight Phi-4-mini shape")
    w.add_block_count(a.layers)
    w.add_context_length(S["ctx"])
    w.add_embedding_length(h)
    w.add_feed_forward_length(ffn)
    w.add_head_count(S["heads"])
    w.add_head_count_kv(S["kv_heads"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(S["rotary"])
    w.add_uint32("phi3.rope.scaling.original_context_length", S["original"])
    w.add_float32("phi3.rope.scaling.attn_factor", math.sqrt(1 + math.log(S["ctx"] / S["original"]) / math.log(S["original"])))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    copy_tokenizer(w, r.fields, pre="gpt-4o", extra_tokens=S["vocab"] - n_src)
    rng = np.random.default_rng(a.seed)

    def rand(*shape, std=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float16)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    factors = (1.0 + 4.0 * rng.random(S["rotary"] // 2)).astype(np.float32)
    w.add_tensor("token_embd.weight", rand(S["vocab"], h))
    if a.untied:
        w.add_tensor("output.weight", rand(S["vocab"], h, std=1.0))
    w.add_tensor("output_norm.weight", norm(h))
    w.add_tensor("rope_factors_short.weight", factors)
    w.add_tensor("rope_factors_long.weight", factors.copy())
    qkv = (S["heads"] + 2 * S["kv_heads"]) * hd
    for i in range(a.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(h))
        w.add_tensor(p + "ffn_norm.weight", norm(h))
        w.add_tensor(p + "attn_qkv.weight", rand(qkv, h))
        w.add_tensor(p + "attn_output.weight", rand(h, S["heads"] * hd))
        w.add_tensor(p + "ffn_up.weight", rand(2 * ffn, h))
        w.add_tensor(p + "ffn_down.weight", rand(h, ffn))
    write(w)


if __name__ == "__main__":
    main()
