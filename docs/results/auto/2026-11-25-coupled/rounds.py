#!/usr/bin/env python3
"""Per method: rounds by nodes verified (k), with mean accepted, verify ms and draft ms.
Usage: rounds.py DIR...  (bench output directories holding runs.jsonl or runs.jsonl.gz)"""
import collections, gzip, json, os, sys

for d in sys.argv[1:]:
    f = os.path.join(d, "runs.jsonl")
    op = open
    if not os.path.exists(f):
        f, op = f + ".gz", gzip.open
    by = collections.defaultdict(lambda: collections.defaultdict(list))
    for line in op(f, "rt"):
        r = json.loads(line)
        for rd in r["rounds"]:
            by[r["method"]][rd["drafted"]].append((rd["accepted"], rd["verify_ms"], rd["draft_ms"]))
    print(d)
    for m, ks in sorted(by.items()):
        total = sum(len(v) for v in ks.values())
        cells = []
        for k, v in sorted(ks.items()):
            n = len(v)
            cells.append(f"k{k}: {n} ({sum(a for a, _, _ in v) / n:.2f} acc, "
                         f"{sum(x for _, x, _ in v) / n:.1f} ms, draft {sum(x for _, _, x in v) / n:.2f})")
        print(f"  {m} ({total} rounds): " + "; ".join(cells))
