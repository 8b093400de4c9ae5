#!/usr/bin/env python3
"""Teacher-forced parity of paradraft with llama.cpp on any GGUF files (random-weight files of
real shapes included): random token ids (fixed seed) as prompts, llama.cpp's top-20 logits
(scripts/quant/llama_logits.c) against `paradraft logits` (int8 path, and --exact), top-1
agreement and mean |Δlogit| as scripts/quant/parity.py reports them.

    python3 scripts/quant/file_parity.py --llama-build PATH/llama.cpp/build FILE.gguf... \
        [--prompts 2 --len 700 --vocab 32000 --json OUT.json]

Prompts longer than a sliding window (Gemma 3: 512) check the window too.
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(__file__))
from parity import ROOT, compare, gguf_types, llama_logits_tool, run  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-build", required=True)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--len", type=int, default=700)
    ap.add_argument("--vocab", type=int, default=32000, help="ids are drawn from [3, VOCAB)")
    ap.add_argument("--paradraft", default=os.path.join(ROOT, "target", "release", "paradraft"))
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/paradraft/parity"))
    ap.add_argument("--json")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    tool = llama_logits_tool(os.path.abspath(a.llama_build), a.work)
    rng = random.Random(1)
    prompts = [[1] + [rng.randrange(3, a.vocab) for _ in range(a.len - 1)] for _ in range(a.prompts)]
    ids_file = os.path.join(a.work, "ids.txt")
    with open(ids_file, "w") as f:
        for ids in prompts:
            f.write(" ".join(map(str, ids)) + "\n")
    rows = []
    for path in a.files:
        theirs = [json.loads(l)["top"] for l in run([tool, path, ids_file, "20"]).splitlines() if l.strip()]
        mine, exact = [], []
        for ids in prompts:
            cmd = [a.paradraft, "logits", "--model", path, "--token-ids", ",".join(map(str, ids)),
                   "--top-k", "200", "--json", "--threads", "2"]
            mine.append([p["top"] for p in json.loads(run(cmd))["positions"]])
            exact.append([p["top"] for p in json.loads(run(cmd + ["--exact"]))["positions"]])
        row = {"file": os.path.basename(path), "tensor_types": gguf_types(path),
               "paradraft_vs_llamacpp": compare(theirs, mine),
               "llamacpp_vs_f32": compare(theirs, exact),
               "paradraft_vs_f32": compare([[t[:20] for t in p] for p in mine], exact)}
        rows.append(row)
        c, l, e = row["paradraft_vs_llamacpp"], row["llamacpp_vs_f32"], row["paradraft_vs_f32"]
        print(f"{row['file']}: vs llama.cpp top-1 {c['top1']:.3f} mean|Δ| {c['mean_abs_dlogit']:.3f} | vs f32: "
              f"llama.cpp {l['top1']:.3f} / {l['mean_abs_dlogit']:.3f}, paradraft {e['top1']:.3f} / "
              f"{e['mean_abs_dlogit']:.3f} ({c['positions']} positions)", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"reference": "llama.cpp (llama-cpp-python 0.3.36 sdist)", "prompts": a.prompts,
                       "len": a.len, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
