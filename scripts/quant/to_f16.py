#!/usr/bin/env python3
"""Writes a GGUF file's weights as F16 (norms and other 1-D tensors as F32), metadata unchanged:
a dense model to try `--quantize` on without llama.cpp (`llama-quantize --allow-requantize IN
OUT F16` writes the same values). Needs the `gguf` and `numpy` packages.

    python3 scripts/quant/to_f16.py IN.gguf OUT.gguf
"""
import sys

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize


def main():
    src, dst = sys.argv[1], sys.argv[2]
    r = GGUFReader(src)
    arch = r.fields["general.architecture"]
    w = GGUFWriter(dst, bytes(arch.parts[arch.data[0]]).decode())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        if vt == GGUFValueType.ARRAY:
            sub = f.types[1]
            if sub == GGUFValueType.STRING:
                val = [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
            else:
                val = [f.parts[i][0].item() for i in f.data]
            w.add_key_value(name, val, vt, sub_type=sub)
        elif vt == GGUFValueType.STRING:
            w.add_key_value(name, bytes(f.parts[f.data[0]]).decode("utf-8", "surrogateescape"), vt)
        else:
            w.add_key_value(name, f.parts[f.data[0]][0].item(), vt)
    for t in r.tensors:
        x = dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(d) for d in reversed(t.shape)]  # GGUF dims are innermost first
        x = x.reshape(shape)
        if x.ndim > 1:
            w.add_tensor(t.name, x.astype(np.float16), raw_dtype=GGMLQuantizationType.F16)
        else:
            w.add_tensor(t.name, x, raw_dtype=GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
