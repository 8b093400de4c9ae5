"""Speedup over AR (and tau) per set and method, old against new, per round; geomeans.
Speedup: decode tokens per decode ms over AR's, summed over the set's prompts.
    python3 docs/results/sizer/2026-11-25-xeon/compare.py [DIR]
DIR: this folder (the final build) or one of its earlier builds' folders."""
import collections, glob, gzip, json, math, os, statistics, sys

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))


def lines(d):
    p = os.path.join(d, "runs.jsonl")
    return open(p) if os.path.exists(p) else gzip.open(p + ".gz", "rt")


def load(d):
    runs = [json.loads(l) for l in lines(d)]
    tok = collections.defaultdict(float)
    ms = collections.defaultdict(float)
    passes = collections.defaultdict(float)
    for r in runs:
        k = (r["dataset"], r["method"])
        tok[k] += r["generated"]
        ms[k] += r["decode_ms"]
        passes[k] += r["target_passes"]
    out = {}
    for (ds, m) in tok:
        if m == "ar":
            continue
        sp = (tok[ds, m] / ms[ds, m]) / (tok[ds, "ar"] / ms[ds, "ar"])
        out[ds, m] = (sp, tok[ds, m] / passes[ds, m])
    return out


for t in (0, 1):
    dirs = sorted(glob.glob(os.path.join(here, f"t{t}_*")))
    if not dirs:
        continue
    res = {os.path.basename(d): load(d) for d in dirs}
    keys = sorted(next(iter(res.values())))
    print(f"\nT = {t}: speedup over AR (tau)")
    print("| set | method | " + " | ".join(res) + " |")
    print("|---|---|" + "---|" * len(res))
    for k in keys:
        print(f"| {k[0]} | {k[1]} | " + " | ".join(f"{r[k][0]:.2f}× ({r[k][1]:.2f})" for r in res.values()) + " |")
    for m in sorted({k[1] for k in keys}):
        g = []
        for name, r in res.items():
            v = [r[k][0] for k in keys if k[1] == m]
            g.append(f"{name} {math.exp(statistics.mean(map(math.log, v))):.3f}")
        print(f"geomean {m}: " + ", ".join(g))
