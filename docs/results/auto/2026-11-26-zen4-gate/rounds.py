"""Per run folder of a bench A/B (runs.jsonl[.gz]): speedup over AR and the share of rounds
that verified no draft node ("none") per set and method, with the geomean; then the rounds by
kind — `model` (draft ms > 0.25: a model forward ran), `lookup` (drafted without one), `none` —
with their drafted and accepted nodes, draft and verify ms and tokens per ms of draft + select +
verify time; then the verify ms of rounds by their drafted nodes (0, 1, 2, 3+) and the previous
round's (0, 1-2, 3+), where 20 or more.
    python3 rounds.py DIR RUN [RUN ...]     (e.g. DIR = this folder, RUN = t0_old_r1)"""
import collections
import gzip
import json
import math
import os
import sys

SETS = ["copy", "gsm8k", "humaneval", "math500", "mt_bench"]


def kind(x):
    return "model" if x["draft_ms"] > 0.25 else ("lookup" if x["drafted"] > 0 else "none")


for name in sys.argv[2:]:
    p = os.path.join(sys.argv[1], name, "runs.jsonl")
    f = open(p) if os.path.exists(p) else gzip.open(p + ".gz", "rt")
    tok, ms, c = collections.Counter(), collections.Counter(), collections.Counter()
    for r in map(json.loads, f):
        k = (r["dataset"], r["method"])
        tok[k] += r["generated"]
        ms[k] += r["decode_ms"]
        prev = None
        for x in r["rounds"]:
            kk = k + (kind(x),)
            c[kk] += 1
            for fld in ("drafted", "accepted", "draft_ms", "select_ms", "verify_ms"):
                c[kk + (fld,)] += x[fld]
            d = min(x["drafted"], 3)
            pd = "0" if prev is None or prev["drafted"] == 0 else ("1-2" if prev["drafted"] <= 2 else "3+")
            c[(r["method"], d, pd)] += 1
            c[(r["method"], d, pd, "v")] += x["verify_ms"]
            prev = x
    methods = sorted({m for _, m in tok if m != "ar"})
    geo = {}
    lines = []
    for ds in [s for s in SETS if ms[s, "ar"]]:
        ar = tok[ds, "ar"] / ms[ds, "ar"]
        cells = []
        for m in methods:
            sp = tok[ds, m] / ms[ds, m] / ar
            geo.setdefault(m, []).append(math.log(sp))
            n = sum(c[ds, m, kd] for kd in ("model", "lookup", "none"))
            cells.append(f"{m} {sp:.3f}x none {c[ds, m, 'none'] / max(1, n) * 100:.0f}%")
        lines.append(f"  {ds:9} " + " | ".join(cells))
        for m in ["ar"] + methods:
            for kd in ("model", "lookup", "none"):
                n = c[ds, m, kd]
                if not n:
                    continue
                g = lambda fld: c[ds, m, kd, fld] / n
                t = (c[ds, m, kd, "accepted"] + n) / max(1e-9, n * (g("draft_ms") + g("select_ms") + g("verify_ms")))
                lines.append(
                    f"      {m:4} {kd:6} n {n:5} drafted {g('drafted'):.2f} accepted {g('accepted'):.2f} "
                    f"draft {g('draft_ms'):.3f} verify {g('verify_ms'):.3f} ms, {t:.3f} tok/ms"
                )
    print(name, " ".join(f"{m} geomean {math.exp(sum(v) / len(v)):.3f}x" for m, v in geo.items()))
    print("\n".join(lines))
    print("  verify ms by drafted nodes (previous round's):")
    for m in ["ar"] + methods:
        for d in range(4):
            cells = [f"after {pd}: n {c[m, d, pd]} {c[m, d, pd, 'v'] / c[m, d, pd]:.3f}" for pd in ("0", "1-2", "3+") if c[m, d, pd] >= 20]
            if cells:
                print(f"      {m:4} {d}{'+' if d == 3 else ''}: " + " | ".join(cells))
