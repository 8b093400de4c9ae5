#!/usr/bin/env python3
"""Per temperature, dataset and method: tau (median of repeats) and speedup over the same run's
AR (min / median of repeats); geometric means over the datasets; accepted share by source.
Usage: aggregate.py OUT (the directory run.sh wrote)."""
import json
import math
import os
import statistics
import sys

out = sys.argv[1]
for t in (0, 1):
    runs = sorted(d for d in os.listdir(out) if d.startswith(f"t{t}-r") and os.path.isdir(os.path.join(out, d)))
    cells, notes = {}, []
    for r in runs:
        s = json.load(open(os.path.join(out, r, "summary.json")))
        for row in s["summaries"]:
            cells.setdefault((row["dataset"], row["method"]), []).append((row["tau_micro"], row["speedup"]))
        notes.append(s.get("drafters", {}).get("auto", ""))
    methods = ["pld", "dart", "auto"]
    sets = sorted({k[0] for k in cells}, key=["copy", "gsm8k", "mt_bench", "humaneval", "math500"].index)
    print(f"\n### T = {t} ({len(runs)} repeats)\n")
    print("| set | " + " | ".join(f"{m} τ | {m} speedup min / median" for m in methods) + " |")
    print("|---|" + "---|---|" * len(methods))
    geo = {m: [] for m in methods}
    for ds in sets:
        row = [ds]
        for m in methods:
            v = cells.get((ds, m), [])
            taus, sps = [x[0] for x in v], [x[1] for x in v]
            geo[m].append(statistics.median(sps))
            row += [f"{statistics.median(taus):.2f}", f"{min(sps):.2f} / {statistics.median(sps):.2f}×"]
        print("| " + " | ".join(row) + " |")
    print("| geomean (medians) | " + " | ".join(f" | {math.exp(sum(map(math.log, geo[m])) / len(geo[m])):.2f}×" for m in methods) + " |")
    for n in notes:
        print(f"\n{n}")
