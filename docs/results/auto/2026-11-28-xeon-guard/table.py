"""Speedup of `auto` over AR per set, from `paradraft bench` summaries named
<prefix>_<round>_<build>_T<temperature>/summary.json.

    python3 table.py DIR PREFIX"""
import json
import os
import statistics as st
import sys

root, prefix = sys.argv[1], sys.argv[2]
rows = {}
for name in sorted(os.listdir(root)):
    p = os.path.join(root, name, "summary.json")
    if not name.startswith(prefix + "_") or not os.path.exists(p):
        continue
    _, rnd, build, temp = name.rsplit("_", 3)
    for s in json.load(open(p))["summaries"]:
        if s["method"] == "auto":
            rows.setdefault((temp, build), {}).setdefault(s["dataset"], []).append(
                (s["speedup"], s["tau_micro"]))
for (temp, build), sets in sorted(rows.items()):
    cells = []
    allv = []
    for d, v in sets.items():
        cells.append(f"{d} " + " / ".join(f"{x:.2f}" for x, _ in v) + f" (τ {st.mean(t for _, t in v):.2f})")
        allv += [x for x, _ in v]
    print(f"{temp:5} {build:5} | " + " | ".join(cells) + f" | geomean {st.geometric_mean(allv):.3f}")
