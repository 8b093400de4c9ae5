"""Speedup over AR and tau per set and method for every run folder here (new weights: fixed8,
t0_r1, t0_r2, t1; old: *_old*), with the geomean over the sets.
Speedup: decode tokens per decode ms over AR's in the same run, summed over the set's prompts.
    python3 docs/results/dart_campaign_bench/2026-11-26-gpu3/compare.py [FOLDER]
(FOLDER: another run.sh output, e.g. a later GPU run's; default: this one)"""
import collections, gzip, json, math, os, sys

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
RUNS = ["fixed8", "fixed8_old", "t0_r1", "t0_old_r1", "t0_old_r2", "t0_r2", "t1", "t1_old"]


def load(d):
    p = os.path.join(d, "runs.jsonl")
    f = open(p) if os.path.exists(p) else gzip.open(p + ".gz", "rt")
    tok, ms, passes, same = (collections.defaultdict(float) for _ in range(4))
    ar_ids = {}
    for r in map(json.loads, f):
        k = (r["dataset"], r["method"])
        tok[k] += r["generated"]
        ms[k] += r["decode_ms"]
        passes[k] += r["target_passes"]
        key = (r["dataset"], r["id"], r.get("turn", 0))
        if r["method"] == "ar":
            ar_ids[key] = r["token_ids"]
        else:
            same[k] += 0 if ar_ids.get(key) == r["token_ids"] else 1
    out = {}
    for ds, m in tok:
        if m != "ar":
            sp = (tok[ds, m] / ms[ds, m]) / (tok[ds, "ar"] / ms[ds, "ar"])
            out[ds, m] = (sp, tok[ds, m] / passes[ds, m], int(same[ds, m]))
    return out


for run in RUNS:
    d = os.path.join(here, run)
    if not os.path.isdir(d):
        continue
    res = load(d)
    for m in sorted({m for _, m in res}):
        sets = sorted(ds for ds, mm in res if mm == m)
        cells = [f"{ds} {res[ds, m][0]:.2f}x tau {res[ds, m][1]:.2f}" for ds in sets]
        geo = math.exp(sum(math.log(res[ds, m][0]) for ds in sets) / len(sets))
        gtau = math.exp(sum(math.log(res[ds, m][1]) for ds in sets) / len(sets))
        diff = sum(res[ds, m][2] for ds in sets)
        print(f"{run:10} {m:5} geomean {geo:.3f}x tau {gtau:.2f} | " + " | ".join(cells) + (f" | {diff} differ from AR" if not run.startswith("t1") else ""))
