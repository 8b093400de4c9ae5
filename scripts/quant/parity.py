#!/usr/bin/env python3
"""Parity of paradraft with llama.cpp on SmolLM2-135M re-quantized into every common GGUF type.

For each type: `llama-quantize --allow-requantize` makes the file from the default Q4_1 model,
llama.cpp's logits (scripts/quant/llama_logits.c, built against the same llama.cpp) and
`paradraft logits` are taken teacher-forced on the reference prompts of
fixtures/smollm2_reference.json, and the script reports top-1 agreement and the mean |Δlogit|
over llama.cpp's top-20 ids. llama.cpp is a fixture tool here, never a dependency.

    python3 scripts/quant/parity.py --llama-build PATH/llama.cpp/build [--out DIR] [--types Q4_K_M,...]

Writes DIR/SmolLM2-135M-Instruct.<TYPE>.gguf and prints a table; --json FILE writes the summary.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TYPES = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q3_K_M", "Q2_K", "IQ4_XS", "Q5_0", "Q5_1", "Q4_0", "Q8_0", "Q4_1"]


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-build", required=True, help="a llama.cpp cmake build dir (bin/, include via ../include)")
    ap.add_argument("--out", default=os.path.expanduser("~/.cache/paradraft/models/requant"))
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--paradraft", default=os.path.join(ROOT, "target", "release", "paradraft"))
    ap.add_argument("--json", help="write the summary here")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    src = run([a.paradraft, "fetch-model"]).strip().splitlines()[-1]
    lb = os.path.abspath(a.llama_build)
    tool = llama_logits_tool(lb, a.out)
    ref = json.load(open(os.path.join(ROOT, "fixtures", "smollm2_reference.json")))
    prompts = [p["token_ids"] for p in ref["prompts"]]
    ids_file = os.path.join(a.out, "prompt_ids.txt")
    with open(ids_file, "w") as f:
        for ids in prompts:
            f.write(" ".join(map(str, ids)) + "\n")
    rows = []
    for ty in a.types.split(","):
        path = os.path.join(a.out, f"SmolLM2-135M-Instruct.{ty}.gguf")
        if not os.path.exists(path):
            run([os.path.join(lb, "bin", "llama-quantize"), "--allow-requantize", src, path, ty])
        tensor_types = gguf_types(path)
        theirs = [json.loads(l)["top"] for l in run([tool, path, ids_file, "20"]).splitlines() if l.strip()]
        mine, exact = [], []
        for ids in prompts:
            cmd = [a.paradraft, "logits", "--model", path, "--token-ids", ",".join(map(str, ids)),
                   "--top-k", "200", "--json"]
            mine.append([p["top"] for p in json.loads(run(cmd))["positions"]])
            exact.append([p["top"] for p in json.loads(run(cmd + ["--exact"]))["positions"]])
        row = {"type": ty, "tensor_types": tensor_types, "file_mb": round(os.path.getsize(path) / 1e6, 1)}
        # paradraft against llama.cpp, and each engine against paradraft's f32 reference path
        # (dequantised weights, f32 activations and KV): which one is nearer the file's model.
        for name, ref, other in [("paradraft_vs_llamacpp", theirs, mine),
                                 ("llamacpp_vs_f32", theirs, exact),
                                 ("paradraft_vs_f32", [[t[:20] for t in p] for p in mine], exact)]:
            row[name] = compare(ref, other)
        rows.append(row)
        c, l, e = row["paradraft_vs_llamacpp"], row["llamacpp_vs_f32"], row["paradraft_vs_f32"]
        print(f"{ty:8s} vs llama.cpp: top-1 {c['top1']:.3f} mean|Δ| {c['mean_abs_dlogit']:.3f} | vs f32: "
              f"llama.cpp {l['top1']:.3f} / {l['mean_abs_dlogit']:.3f}, paradraft {e['top1']:.3f} / "
              f"{e['mean_abs_dlogit']:.3f}  ({c['positions']} positions; {row['file_mb']} MB; {tensor_types})",
              flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": os.path.basename(src), "reference": "llama.cpp (llama-cpp-python 0.3.36 sdist)",
                       "rows": rows}, f, indent=1)


def llama_logits_tool(llama_build, out_dir):
    """scripts/quant/llama_logits.c built against a llama.cpp build (once, into `out_dir`)."""
    root = os.path.dirname(llama_build)
    tool = os.path.join(out_dir, "llama_logits")
    src = os.path.join(ROOT, "scripts", "quant", "llama_logits.c")
    if not os.path.exists(tool) or os.path.getmtime(tool) < os.path.getmtime(src):
        run(["gcc", "-O2", "-o", tool, src,
             "-I", os.path.join(root, "include"), "-I", os.path.join(root, "ggml", "include"),
             "-L", os.path.join(llama_build, "bin"), "-lllama", "-lggml", "-lggml-base",
             "-Wl,-rpath," + os.path.join(llama_build, "bin")])
    return tool


def compare(ref, other):
    """Top-1 agreement, and mean |Δlogit| over `ref`'s top-20 ids found in `other`'s list."""
    agree = total = 0
    deltas = []
    for rp, op in zip(ref, other):
        for r, o in zip(rp, op):
            total += 1
            agree += r[0][0] == o[0][0]
            m = {i: v for i, v in o}
            deltas += [abs(m[i] - v) for i, v in r[:20] if i in m]
    return {"positions": total, "top1": agree / total, "mean_abs_dlogit": sum(deltas) / max(1, len(deltas)),
            "logits_compared": len(deltas)}


def gguf_types(path):
    """Tensor type counts of a GGUF file (with the `gguf` package when installed)."""
    try:
        import gguf
    except ImportError:
        return {}
    r = gguf.GGUFReader(path)
    counts = {}
    for t in r.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


if __name__ == "__main__":
    sys.exit(main())
