#!/usr/bin/env python3
"""Writes a random-weight GGUF of Qwen3-30B-A3B's shape (qwen3moe: hidden 2048, 32 heads / 4 KV
heads of 128, q/k norms, 128 experts of width 768, 8 per token, vocab 151,936, untied output) —
or, with --family qwen2moe, Qwen1.5-MoE-A2.7B's (16 / 16 heads of 128 with q/k/v biases, 60
experts of width 1408, 4 per token, a gated shared expert of width 5632) — with its first
--layers layers, in the types a Q4_K_M file of it has most (Q4_K attention and
gate/up experts, Q6_K attn_v, down experts and output, F32 router): a speed test of mixtures of
experts at a real size (the values do not change the work). The blocks are random bytes with
sane scales, written directly (no f16 stage, no llama-quantize). The tokenizer is the SmolLM2
file's, padded with unused tokens to the vocabulary size.

    python3 scripts/quant/random_moe.py --src SmolLM2-135M-Instruct.Q4_1.gguf --layers 16 \
        --out DIR/qwen3-30b-a3b-shape-16l.Q4_K.gguf
    python3 scripts/quant/random_moe.py --family qwen2moe --src … --layers 12 \
        --out DIR/qwen1.5-moe-a2.7b-shape-12l.Q4_K.gguf
"""
import argparse
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer import copy_tokenizer  # noqa: E402

SHAPES = {
    "qwen3moe": dict(name="Qwen3-30B-A3B", layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128,
                     experts=128, used=8, expert_ff=768, shared_ff=0, ff=6144, vocab=151936, ctx=40960,
                     rope=1000000.0),
    "qwen2moe": dict(name="Qwen1.5-MoE-A2.7B", layers=24, hidden=2048, heads=16, kv_heads=16, head_dim=128,
                     experts=60, used=4, expert_ff=1408, shared_ff=5632, ff=5632, vocab=151936, ctx=8192,
                     rope=1000000.0),
}
# Byte offsets of each block's f16 scale fields, and scales that keep weights about ±0.05.
F16_FIELDS = {T.Q4_K: [0, 2], T.Q6_K: [208], T.Q8_0: [0]}
SCALES = {T.Q4_K: 0.0001, T.Q6_K: 0.00001, T.Q8_0: 0.0004}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True, help="a GGUF whose tokenizer the file takes")
    ap.add_argument("--out", required=True)
    ap.add_argument("--family", choices=sorted(SHAPES), default="qwen3moe")
    ap.add_argument("--layers", type=int, default=0, help="default: all of the shape's")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    s = SHAPES[a.family]
    layers = a.layers or s["layers"]
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(a.out, a.family)
    w.add_name(f"random-weight {s['name']} shape, {layers} of {s['layers']} layers")
    w.add_block_count(layers)
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["ff"])
    w.add_expert_feed_forward_length(s["expert_ff"])
    if s["shared_ff"]:
        w.add_expert_shared_feed_forward_length(s["shared_ff"])
    w.add_expert_count(s["experts"])
    w.add_expert_used_count(s["used"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(s["rope"])
    w.add_layer_norm_rms_eps(1e-6)
    f = gguf.GGUFReader(a.src).fields
    pad = s["vocab"] - len(f["tokenizer.ggml.tokens"].contents())
    copy_tokenizer(w, f, extra_tokens=pad)

    def quant(name, qtype, shape):
        block_len, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        n = int(np.prod(shape)) // block_len
        raw = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
        for k, off in enumerate(F16_FIELDS[qtype]):
            val = (SCALES[qtype] * (0.5 + rng.random(n)) * (1.0 if k == 0 else 0.5)).astype(np.float16)
            raw[:, off:off + 2] = val.view(np.uint8).reshape(n, 2)
        w.add_tensor(name, raw.reshape(*shape[:-1], shape[-1] // block_len * block_bytes), raw_dtype=qtype)

    h, hd, e, ff = s["hidden"], s["head_dim"], s["experts"], s["expert_ff"]
    quant("token_embd.weight", T.Q4_K, (s["vocab"], h))
    quant("output.weight", T.Q6_K, (s["vocab"], h))
    w.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    qwen2 = a.family == "qwen2moe"
    for i in range(layers):
        p = f"blk.{i}."
        for n in ["attn_norm", "ffn_norm"]:
            w.add_tensor(p + n + ".weight", np.ones(h, dtype=np.float32))
        if qwen2:
            for n, rows in [("attn_q", s["heads"] * hd), ("attn_k", s["kv_heads"] * hd), ("attn_v", s["kv_heads"] * hd)]:
                w.add_tensor(p + n + ".bias", (0.02 * rng.standard_normal(rows)).astype(np.float32))
        else:
            for n in ["attn_q_norm", "attn_k_norm"]:
                w.add_tensor(p + n + ".weight", np.ones(hd, dtype=np.float32))
        quant(p + "attn_q.weight", T.Q4_K, (s["heads"] * hd, h))
        quant(p + "attn_k.weight", T.Q4_K, (s["kv_heads"] * hd, h))
        quant(p + "attn_v.weight", T.Q6_K, (s["kv_heads"] * hd, h))
        quant(p + "attn_output.weight", T.Q4_K, (h, s["heads"] * hd))
        w.add_tensor(p + "ffn_gate_inp.weight", (0.05 * rng.standard_normal((e, h))).astype(np.float32))
        quant(p + "ffn_gate_exps.weight", T.Q4_K, (e, ff, h))
        quant(p + "ffn_up_exps.weight", T.Q4_K, (e, ff, h))
        # Rows of 1408 (Qwen1.5-MoE) are no whole number of 256-blocks: llama-quantize's
        # fallback for Q6_K there is Q8_0.
        quant(p + "ffn_down_exps.weight", T.Q6_K if ff % 256 == 0 else T.Q8_0, (e, h, ff))
        if s["shared_ff"]:
            sf = s["shared_ff"]
            w.add_tensor(p + "ffn_gate_inp_shexp.weight", (0.05 * rng.standard_normal(h)).astype(np.float32))
            quant(p + "ffn_gate_shexp.weight", T.Q4_K, (sf, h))
            quant(p + "ffn_up_shexp.weight", T.Q4_K, (sf, h))
            quant(p + "ffn_down_shexp.weight", T.Q6_K, (h, sf))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(a.out, os.path.getsize(a.out), "bytes")


if __name__ == "__main__":
    main()
