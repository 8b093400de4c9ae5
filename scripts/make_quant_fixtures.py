#!/usr/bin/env python3
"""Writes the quantized-type fixtures (run once by hand; needs `pip install gguf numpy`; the
tests only read the files):

- fixtures/quants/blocks.gguf: for every quantized GGML type paradraft loads, random blocks
  ("<TYPE>.q", raw GGML bytes) and their dequantisation by the `gguf` Python package
  ("<TYPE>.f32"), an implementation independent of paradraft's.
- fixtures/quants/tiny-kquant.gguf: a random-weight Llama (hidden 256, 2 layers) whose tensors
  mix every K-quant and the other block types, with the tiny Llama's tokenizer: the
  speculative methods' losslessness and the loader's bad-input handling on such a file.
- fixtures/quants/tiny-moe-kquant.gguf: a random-weight Qwen3-MoE (hidden 256, 2 layers of 8
  experts, 2 per token) with stacked K-quant experts (Q4_K gate/up, Q6_K down in layer 0; Q5_K /
  Q8_0 in layer 1), an F32 router and Q8_0 attention: quantized experts sliced from their stacks.

    python3 scripts/make_quant_fixtures.py
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "quant"))
from tokenizer import copy_tokenizer  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
OUT = os.path.join(ROOT, "fixtures", "quants", "blocks.gguf")

# Byte offsets of each block's f16 fields (scales, mins): random bytes there could be inf/NaN.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0],
}
ROWS, COLS = 6, 512


def blocks(qtype, rng):
    block_len, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n = ROWS * COLS // block_len
    raw = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        # Both signs, magnitudes across the f16 range a model uses, some exact zeros and
        # some subnormals.
        mag = 10.0 ** rng.uniform(-6, 0, size=n)
        val = (np.where(rng.random(n) < 0.5, -1.0, 1.0) * mag).astype(np.float16)
        val[rng.random(n) < 0.05] = 0
        raw[:, off:off + 2] = val.view(np.uint8).reshape(n, 2)
    return raw.reshape(ROWS, COLS // block_len * block_bytes)


def main():
    rng = np.random.default_rng(20261127)
    w = gguf.GGUFWriter(OUT, "paradraft-quant-fixture")
    from importlib.metadata import version
    w.add_string("fixture.reference", f"gguf-py {version('gguf')} quants.dequantize")
    for qtype in F16_FIELDS:
        raw = blocks(qtype, rng)
        ref = gguf.quants.dequantize(raw, qtype).astype(np.float32)
        assert ref.shape == (ROWS, COLS), ref.shape
        w.add_tensor(f"{qtype.name}.q", raw, raw_dtype=qtype)
        w.add_tensor(f"{qtype.name}.f32", ref)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(OUT, os.path.getsize(OUT), "bytes")
    tiny_model(rng)
    tiny_moe(np.random.default_rng(7))


def quant_writer(w, rng):
    """`quant(name, qtype, shape, scale)`: random blocks of `qtype` whose weights are about
    `scale` in size, as a tensor of `shape` (the last dimension the row)."""
    def quant(name, qtype, shape, scale):
        block_len, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        n = int(np.prod(shape)) // block_len
        raw = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
        for k, off in enumerate(F16_FIELDS[qtype]):
            val = (scale * (0.5 + rng.random(n)) * (1.0 if k == 0 else 0.5)).astype(np.float16)
            raw[:, off:off + 2] = val.view(np.uint8).reshape(n, 2)
        rows = list(shape[:-1])
        w.add_tensor(name, raw.reshape(*rows, shape[-1] // block_len * block_bytes), raw_dtype=qtype)
    return quant


# Per-type scales that keep every weight within about ±0.05 (a well-conditioned forward).
SCALES = {T.Q2_K: 0.0025, T.Q3_K: 0.0005, T.Q4_K: 0.0001, T.Q5_K: 0.00005, T.Q6_K: 0.00001,
          T.IQ4_XS: 0.00001, T.IQ4_NL: 0.0002, T.Q5_0: 0.001, T.Q5_1: 0.0005, T.Q8_0: 0.0002,
          T.Q4_0: 0.002, T.Q4_1: 0.001}


def tiny_moe(rng):
    out = os.path.join(ROOT, "fixtures", "quants", "tiny-moe-kquant.gguf")
    src = gguf.GGUFReader(os.path.join(ROOT, "fixtures", "tiny", "llama-quant.gguf"))
    hidden, ff, heads, kv_heads, hd, layers, experts = 256, 256, 4, 2, 64, 2, 8
    vocab = len(src.fields["tokenizer.ggml.tokens"].contents())
    w = gguf.GGUFWriter(out, "qwen3moe")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff * 2)
    w.add_expert_feed_forward_length(ff)
    w.add_expert_count(experts)
    w.add_expert_used_count(2)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    # "qwen2": a pre-tokenizer llama.cpp knows (the tiny Llama's "gpt2" it refuses), for parity.
    copy_tokenizer(w, src.fields, pre="qwen2")
    quant = quant_writer(w, rng)
    quant("token_embd.weight", T.Q8_0, (vocab, hidden), SCALES[T.Q8_0] * 20)
    quant("output.weight", T.Q6_K, (vocab, hidden), SCALES[T.Q6_K])
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    mixes = [(T.Q4_K, T.Q4_K, T.Q6_K), (T.Q5_K, T.Q5_K, T.Q8_0)]
    for i, (tg, tu, td) in enumerate(mixes):
        p = f"blk.{i}."
        for n in ["attn_norm", "ffn_norm"]:
            w.add_tensor(p + n + ".weight", np.ones(hidden, dtype=np.float32))
        for n in ["attn_q_norm", "attn_k_norm"]:
            w.add_tensor(p + n + ".weight", (1.0 + 0.1 * rng.standard_normal(hd)).astype(np.float32))
        for n, rows, cols in [("attn_q", heads * hd, hidden), ("attn_k", kv_heads * hd, hidden),
                              ("attn_v", kv_heads * hd, hidden), ("attn_output", hidden, heads * hd)]:
            quant(p + n + ".weight", T.Q8_0, (rows, cols), SCALES[T.Q8_0])
        w.add_tensor(p + "ffn_gate_inp.weight",
                     (0.1 * rng.standard_normal((experts, hidden))).astype(np.float32))
        quant(p + "ffn_gate_exps.weight", tg, (experts, ff, hidden), SCALES[tg])
        quant(p + "ffn_up_exps.weight", tu, (experts, ff, hidden), SCALES[tu])
        quant(p + "ffn_down_exps.weight", td, (experts, hidden, ff), SCALES[td])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(out, os.path.getsize(out), "bytes")


def tiny_model(rng):
    out = os.path.join(ROOT, "fixtures", "quants", "tiny-kquant.gguf")
    src = gguf.GGUFReader(os.path.join(ROOT, "fixtures", "tiny", "llama-quant.gguf"))
    f = src.fields
    hidden, ffn, heads, kv_heads, layers = 256, 512, 4, 2, 2
    vocab = len(f["tokenizer.ggml.tokens"].contents())
    w = gguf.GGUFWriter(out, "llama")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hidden // heads)
    copy_tokenizer(w, f)

    def quant(name, qtype, rows, cols, scale):
        block_len, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        n = rows * cols // block_len
        raw = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
        for k, off in enumerate(F16_FIELDS[qtype]):
            # Scales sized so that a weight is about `scale`; the second field (a min) smaller.
            val = (scale * (0.5 + rng.random(n)) * (1.0 if k == 0 else 0.5)).astype(np.float16)
            raw[:, off:off + 2] = val.view(np.uint8).reshape(n, 2)
        w.add_tensor(name, raw.reshape(rows, cols // block_len * block_bytes), raw_dtype=qtype)

    hd = hidden // heads
    # Per-type scales that keep every weight within about ±0.05 (a well-conditioned forward).
    s = {T.Q2_K: 0.0025, T.Q3_K: 0.0005, T.Q4_K: 0.0001, T.Q5_K: 0.00005, T.Q6_K: 0.00001,
         T.IQ4_XS: 0.00001, T.IQ4_NL: 0.0002, T.Q5_0: 0.001, T.Q5_1: 0.0005, T.Q8_0: 0.0002,
         T.Q4_0: 0.002, T.Q4_1: 0.001}
    mixes = [
        [T.Q4_K, T.Q5_K, T.Q6_K, T.Q3_K, T.Q2_K, T.IQ4_XS, T.Q6_K],
        [T.Q5_0, T.Q5_1, T.IQ4_NL, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K],
    ]
    quant("token_embd.weight", T.Q6_K, vocab, hidden, s[T.Q6_K])
    quant("output.weight", T.Q5_K, vocab, hidden, s[T.Q5_K])
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    for i, mix in enumerate(mixes):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        shapes = [("attn_q", heads * hd, hidden), ("attn_k", kv_heads * hd, hidden),
                  ("attn_v", kv_heads * hd, hidden), ("attn_output", hidden, heads * hd),
                  ("ffn_gate", ffn, hidden), ("ffn_up", ffn, hidden), ("ffn_down", hidden, ffn)]
        for (name, rows, cols), qtype in zip(shapes, mix):
            quant(p + name + ".weight", qtype, rows, cols, s[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(out, os.path.getsize(out), "bytes")


if __name__ == "__main__":
    if sys.argv[1:] == ["moe"]:
        tiny_moe(np.random.default_rng(7))
    else:
        main()
