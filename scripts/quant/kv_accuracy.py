#!/usr/bin/env python3
"""What `--kv-dtype q8_0` costs in accuracy: teacher-forced top-20 logits of a model on the
reference prompts (fixtures/smollm2_reference.json) with the f16 KV cache (the default) against
the same model with a q8_0 (and the f32) cache; top-1 agreement and mean |Δlogit| as
scripts/quant/parity.py reports them. Every position of a prompt reads the cache's K/V of the
positions before it (and its own), so each logit row sees the cache type. With --llama-build,
llama.cpp's own q8_0 cache against its f16 one on the same positions too (-ctk/-ctv q8_0, both
through flash attention): how far the format itself moves this model's logits.

    python3 scripts/quant/kv_accuracy.py [--model MODEL] [--types q8_0,f32] [--json OUT]
        [--llama-build PATH/llama.cpp/build]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from parity import ROOT, compare, llama_logits_tool, run  # noqa: E402


def logits(paradraft, model, ids, kv):
    cmd = [paradraft, "logits", "--token-ids", ",".join(map(str, ids)), "--top-k", "20", "--json",
           "--kv-dtype", kv] + (["--model", model] if model else [])
    return [p["top"] for p in json.loads(run(cmd))["positions"]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="default: the fetched SmolLM2-135M-Instruct Q4_1")
    ap.add_argument("--types", default="q8_0,f32")
    ap.add_argument("--paradraft", default=os.path.join(ROOT, "target", "release", "paradraft"))
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("--llama-build", help="a llama.cpp cmake build dir: measure its q8_0 cache too")
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/paradraft/kv_accuracy"))
    a = ap.parse_args()
    ref = json.load(open(os.path.join(ROOT, "fixtures", "smollm2_reference.json")))
    prompts = [p["token_ids"] for p in ref["prompts"]]
    base = [logits(a.paradraft, a.model, ids, "f16") for ids in prompts]
    rows = []
    for ty in a.types.split(","):
        got = [logits(a.paradraft, a.model, ids, ty) for ids in prompts]
        rows.append(dict(kv=ty, **compare(base, got)))
    if a.llama_build:
        os.makedirs(a.work, exist_ok=True)
        tool = llama_logits_tool(os.path.abspath(a.llama_build), a.work)
        model = a.model or run([a.paradraft, "fetch-model"]).strip().splitlines()[-1]
        ids_file = os.path.join(a.work, "prompt_ids.txt")
        with open(ids_file, "w") as f:
            f.writelines(" ".join(map(str, ids)) + "\n" for ids in prompts)

        def theirs(kv):
            out = run([tool, model, ids_file, "20", kv])
            return [json.loads(line)["top"] for line in out.splitlines() if line.strip()]
        lf16 = theirs("f16")
        rows.append(dict(kv="llama.cpp q8_0", baseline="llama.cpp f16", **compare(lf16, theirs("q8_0"))))
        rows.append(dict(kv="llama.cpp f16", baseline="paradraft f16", **compare(base, lf16)))
    for r in rows:
        print(f"{r['kv']:6s} vs {r.get('baseline', 'f16 KV')}: top-1 {r['top1']:.3f}  mean|Δlogit| {r['mean_abs_dlogit']:.4f}  "
              f"({r['positions']} positions)")
    if a.json:
        name = os.path.basename((a.model or "SmolLM2-135M-Instruct.Q4_1.gguf").rstrip("/"))
        with open(a.json, "w") as f:
            json.dump({"model": name, "baseline": "f16 KV cache", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
