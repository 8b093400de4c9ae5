"""A bench run's rounds by method and why they verified no draft: how many, and their time
(draft to commit) over the mean AR round's; drafted rounds by size: time over AR's, mean
accepted nodes, and tokens per ms over AR's ("gain").
    python3 docs/results/sizer/2026-11-25-xeon/rounds.py RUN_DIR"""
import collections, gzip, json, os, statistics, sys

d = sys.argv[1]
p = os.path.join(d, "runs.jsonl")
runs = [json.loads(l) for l in (open(p) if os.path.exists(p) else gzip.open(p + ".gz", "rt"))]
total = lambda x: x["draft_ms"] + x["tree_ms"] + x["verify_ms"] + x["commit_ms"]
ar = statistics.mean(total(x) for r in runs if r["method"] == "ar" for x in r["rounds"])
print(f"{d}: mean AR round {ar:.2f} ms")
for m in sorted({r["method"] for r in runs} - {"ar"}):
    rounds = [x for r in runs if r["method"] == m for x in r["rounds"]]
    why = collections.defaultdict(list)
    size = collections.defaultdict(list)
    for x in rounds:
        if x["drafted"] == 0:
            why[x.get("undrafted")].append(x)
        else:
            size[x["drafted"]].append(x)
    print(f"  {m}: {len(rounds)} rounds")
    for k, xs in sorted(why.items(), key=lambda kv: str(kv[0])):
        print(f"    undrafted ({k}): {len(xs)}, {statistics.mean(map(total, xs)) / ar:.3f}× AR")
    cells = []
    for n, xs in sorted(size.items()):
        if len(xs) >= 10:
            c = statistics.mean(map(total, xs)) / ar
            a = statistics.mean(x["accepted"] for x in xs)
            cells.append(f"{n}: {c:.2f}× AR, {a:.2f} accepted, gain {(1 + a) / c:.2f} ({len(xs)})")
    print("    drafted " + "; ".join(cells))
