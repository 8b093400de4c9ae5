#!/usr/bin/env python3
"""What `--quantize` costs in accuracy: teacher-forced top-20 logits of a dense model (an HF
directory or an F16 / BF16 / F32 GGUF) on the reference prompts (fixtures/smollm2_reference.json),
unquantized on the exact path (f32 weights, activations and KV) against the same model loaded
with `--quantize q8_0|q4_0|q4_1` on the int8 path; top-1 agreement and mean |Δlogit| as
scripts/quant/parity.py reports them.

    python3 scripts/quant/quantize_accuracy.py MODEL [--types q8_0,q4_0,q4_1] [--json OUT]
        [--files A.gguf,B.gguf]   (quantized files of the same model, e.g. llama-quantize's,
                                   against the same baseline for comparison)

The F16 SmolLM2 used in docs/gguf.md: `llama-quantize --allow-requantize SmolLM2…Q4_1.gguf
SmolLM2…F16.gguf F16` (its weights are the Q4_1 file's, dequantized).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from parity import ROOT, compare, run  # noqa: E402


def logits(paradraft, model, ids, extra):
    cmd = [paradraft, "logits", "--model", model, "--token-ids", ",".join(map(str, ids)),
           "--top-k", "20", "--json"] + extra
    return [p["top"] for p in json.loads(run(cmd))["positions"]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--types", default="q8_0,q4_0,q4_1")
    ap.add_argument("--paradraft", default=os.path.join(ROOT, "target", "release", "paradraft"))
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("--files", default="", help="comma-separated quantized files to compare too")
    a = ap.parse_args()
    ref = json.load(open(os.path.join(ROOT, "fixtures", "smollm2_reference.json")))
    prompts = [p["token_ids"] for p in ref["prompts"]]
    exact = [logits(a.paradraft, a.model, ids, ["--exact"]) for ids in prompts]
    rows = [dict(type="none (int8 activations)",
                 **compare(exact, [logits(a.paradraft, a.model, ids, []) for ids in prompts]))]
    for ty in a.types.split(","):
        got = [logits(a.paradraft, a.model, ids, ["--quantize", ty]) for ids in prompts]
        rows.append(dict(type=ty, **compare(exact, got)))
    for path in filter(None, a.files.split(",")):
        got = [logits(a.paradraft, path, ids, []) for ids in prompts]
        rows.append(dict(type=os.path.basename(path), **compare(exact, got)))
    for r in rows:
        print(f"{r['type']:24s} top-1 {r['top1']:.3f}  mean|Δlogit| {r['mean_abs_dlogit']:.3f}  "
              f"({r['positions']} positions)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": os.path.basename(a.model.rstrip("/")), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
