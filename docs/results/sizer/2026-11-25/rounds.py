#!/usr/bin/env python3
"""What a round's verify costs against an AR step, by draft nodes, from a bench run's rounds:
the median verify_ms of `dart` rounds with n nodes over the median of the run's AR rounds; and
how many rounds each method's sizer left undrafted, by reason.

    python3 docs/results/sizer/2026-11-25/rounds.py docs/results/sizer/2026-11-25/new_t0
"""
import collections
import gzip
import json
import statistics
import sys

runs = [json.loads(line) for line in gzip.open(sys.argv[1] + "/runs.jsonl.gz")]
for ds in sorted({r["dataset"] for r in runs}):
    ar = statistics.median(
        x["verify_ms"] for r in runs if r["method"] == "ar" and r["dataset"] == ds for x in r["rounds"]
    )
    by = collections.defaultdict(list)
    for r in runs:
        if r["method"] == "dart" and r["dataset"] == ds:
            for x in r["rounds"]:
                by[x["drafted"]].append(x["verify_ms"])
    cells = [
        f"{n} nodes {statistics.median(v) / ar:.2f} (n={len(v)})"
        for n, v in sorted(by.items())
        if n > 0 and len(v) >= 20
    ]
    print(f"{ds}: AR {ar:.2f} ms; " + ", ".join(cells))
    for m in sorted({r["method"] for r in runs} - {"ar"}):
        rounds = [x for r in runs if r["method"] == m and r["dataset"] == ds for x in r["rounds"]]
        why = collections.Counter(x.get("undrafted") for x in rounds if x.get("undrafted"))
        print(f"  {m}: {len(rounds)} rounds, undrafted {dict(why)}")
