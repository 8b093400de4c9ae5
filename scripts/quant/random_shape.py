#!/usr/bin/env python3
"""Writes a random-weight GGUF of SmolLM2-1.7B's shape (24 layers, hidden 2048, FFN 8192, 32
heads, vocab 49152, tied embeddings) in F16, with the tokenizer and chat template of the default
SmolLM2-135M file: a speed test at a realistic size (the values do not change the work). Make
the quantized files from it with llama-quantize (scripts/quant/parity.py does that for 135M).

    python3 scripts/quant/random_shape.py --src SmolLM2-135M-Instruct.Q4_1.gguf --out DIR/smollm2-1.7b-shape.F16.gguf
"""
import argparse

import numpy as np
import gguf
from tokenizer import copy_tokenizer, write

SHAPE = dict(layers=24, hidden=2048, ffn=8192, heads=32, kv_heads=32, vocab=49152, ctx=8192, rope=130000.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True, help="a SmolLM2 GGUF whose tokenizer the file takes")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    s = SHAPE
    r = gguf.GGUFReader(a.src)
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("random-weight SmolLM2-1.7B shape")
    w.add_block_count(s["layers"])
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_freq_base(s["rope"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(s["vocab"])
    w.add_rope_dimension_count(s["hidden"] // s["heads"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    f = r.fields
    copy_tokenizer(w, f)
    w.add_unk_token_id(f["tokenizer.ggml.unknown_token_id"].contents())
    w.add_pad_token_id(f["tokenizer.ggml.padding_token_id"].contents())
    w.add_add_space_prefix(False)
    rng = np.random.default_rng(a.seed)
    h, ffn, hd = s["hidden"], s["ffn"], s["hidden"] // s["heads"]

    def rand(*shape, std=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float16)

    w.add_tensor("token_embd.weight", rand(s["vocab"], h))
    w.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    for i in range(s["layers"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(h, dtype=np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(h, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", rand(s["heads"] * hd, h))
        w.add_tensor(p + "attn_k.weight", rand(s["kv_heads"] * hd, h))
        w.add_tensor(p + "attn_v.weight", rand(s["kv_heads"] * hd, h))
        w.add_tensor(p + "attn_output.weight", rand(h, s["heads"] * hd))
        w.add_tensor(p + "ffn_gate.weight", rand(ffn, h))
        w.add_tensor(p + "ffn_up.weight", rand(ffn, h))
        w.add_tensor(p + "ffn_down.weight", rand(h, ffn))
    write(w)


if __name__ == "__main__":
    main()
