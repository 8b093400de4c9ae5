#!/usr/bin/env python3
"""What `--kv-dtype q8_0` costs in accuracy: teacher-forced top-20 logits of a model on the
reference prompts (fixtures/smollm2_reference.json) with the f16 KV cache (the default) against
the same model with a q8_0 (and the f32) cache; top-1 agreement and mean |Δlogit| as
scripts/quant/parity.py reports them. Every position of a prompt reads the cache's K/V of the
positions before it (and its own), so each logit row sees the cache type. With --llama-build,
llama.cpp's own q8_0 cache against its f16 one on the same positions too (-ctk/-ctv q8_0, both
through flash attention): how far the format itself moves this model's logits.

    python3 scripts/quant/kv_accuracy.py [--model MODEL] [--types q8_0,f32] [--json OUT]
        [--llama-build PATH/llama.cpp/build] [--corpus N [--len L]]

The reference prompts share the chat template's opening, so their first positions repeat the
same context (272 positions, fewer distinct ones). --corpus N adds N documents of the
committed corpus (data/corpus, every 7th document from the first, its first L tokens): distinct
contexts in numbers that make a top-1 rate's sampling error small.
"""
import argparse
import gzip
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from parity import ROOT, compare, llama_logits_tool, run  # noqa: E402


def logits(paradraft, model, ids, kv, f32_acts=False):
    """Top-20 logits per position; kv "exact" is the exact path (f32 activations and cache),
    f32_acts the exact path's activations with the `kv` cache."""
    cmd = [paradraft, "logits", "--token-ids", ",".join(map(str, ids)), "--top-k", "20", "--json"]
    cmd += ["--exact"] if kv == "exact" else ["--kv-dtype", kv]
    cmd += ["--exact-activations"] if f32_acts else []
    cmd += ["--model", model] if model else []
    return [p["top"] for p in json.loads(run(cmd))["positions"]]


def corpus_prompts(paradraft, model, n, length):
    """Token ids of n corpus documents (every 7th, so that sources vary), L tokens each."""
    docs = []
    with gzip.open(os.path.join(ROOT, "data", "corpus", "corpus_permissive.jsonl.gz"), "rt") as f:
        for i, line in enumerate(f):
            if i % 7 == 0:
                docs.append(json.loads(line)["text"][: 8 * length])
            if len(docs) == n:
                break
    out = []
    for text in docs:
        cmd = [paradraft, "logits", "--prompt", text, "--top-k", "1", "--json"] + (["--model", model] if model else [])
        out.append(json.loads(run(cmd))["token_ids"][:length])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="default: the fetched SmolLM2-135M-Instruct Q4_1")
    ap.add_argument("--types", default="q8_0,f32")
    ap.add_argument("--paradraft", default=os.path.join(ROOT, "target", "release", "paradraft"))
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("--llama-build", help="a llama.cpp cmake build dir: measure its q8_0 cache too")
    ap.add_argument("--against-exact", action="store_true",
                    help="also each type against the exact path (f32 activations and cache)")
    ap.add_argument("--corpus", type=int, default=0, help="add this many corpus documents")
    ap.add_argument("--len", type=int, default=256, help="tokens of each corpus document")
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/paradraft/kv_accuracy"))
    a = ap.parse_args()
    ref = json.load(open(os.path.join(ROOT, "fixtures", "smollm2_reference.json")))
    prompts = [p["token_ids"] for p in ref["prompts"]]
    if a.corpus:
        prompts += corpus_prompts(a.paradraft, a.model, a.corpus, a.len)
    distinct = len({tuple(ids[:i + 1]) for ids in prompts for i in range(len(ids))})
    # Each cache type's logits on the default path, computed once: f16 is the baseline.
    types = a.types.split(",")
    got = {ty: [logits(a.paradraft, a.model, ids, ty) for ids in prompts] for ty in ["f16"] + types}
    base = got["f16"]
    rows = []
    if a.against_exact:
        # Each cache type against the exact path: how far each is from the arithmetic it
        # approximates, f16 (the default) included.
        exact = [logits(a.paradraft, a.model, ids, "exact") for ids in prompts]
        for ty in ["f16"] + types:
            rows.append(dict(kv=ty, baseline="exact path", distinct_contexts=distinct, **compare(exact, got[ty])))
        # The cache type alone: f32 activations on both sides, so that the int8 activations'
        # rounding (which flips near-ties whatever the cache) is out of the comparison.
        f16_f32a = [logits(a.paradraft, a.model, ids, "f16", True) for ids in prompts]
        for ty in types:
            alone = [logits(a.paradraft, a.model, ids, ty, True) for ids in prompts]
            rows.append(dict(kv=ty + " (f32 activations)", baseline="f16 KV (f32 activations)",
                             distinct_contexts=distinct, **compare(f16_f32a, alone)))
    for ty in types:
        rows.append(dict(kv=ty, distinct_contexts=distinct, **compare(base, got[ty])))
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
              f"({r['positions']} positions, {distinct} distinct contexts)")
    if a.json:
        name = os.path.basename((a.model or "SmolLM2-135M-Instruct.Q4_1.gguf").rstrip("/"))
        with open(a.json, "w") as f:
            json.dump({"model": name, "baseline": "f16 KV cache", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
