#!/usr/bin/env python3
"""Writes fixtures/quants/blocks.gguf: for every quantized GGML type paradraft loads, random
blocks ("<TYPE>.q", raw GGML bytes) and their dequantisation by the `gguf` Python package
("<TYPE>.f32"), an implementation independent of paradraft's. Run once by hand (needs
`pip install gguf numpy`); the tests only read the file.

    python3 scripts/make_quant_fixtures.py
"""
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

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


if __name__ == "__main__":
    main()
