"""AR rounds after drafting, by their place in a run of AR rounds, against the AR run's rounds.

    python3 stretch.py RUNS.jsonl [RUNS.jsonl ...]

For every non-AR run of a `paradraft bench` runs file: each round the speed guard held off
(`probe` or `speed_guard`) at its place in a run of such rounds (1st, 2nd, ... 7th and later),
its verify + commit ms over the median verify ms of the same prompt's AR run (rounds 7 on).
Prints the median ratio per (method, place)."""
import json
import statistics as st
import sys
from collections import defaultdict

for path in sys.argv[1:]:
    runs = [json.loads(line) for line in open(path)]
    ar = {
        (r["id"], r["turn"]): st.median(x["verify_ms"] for x in r["rounds"][6:])
        for r in runs
        if r["method"] == "ar"
    }
    by = defaultdict(list)
    for r in runs:
        if r["method"] == "ar":
            continue
        place = 0
        for i, x in enumerate(r["rounds"]):
            place = place + 1 if x.get("undrafted") in ("probe", "speed_guard") else 0
            if i >= 5 and place > 0:
                ms = x["verify_ms"] + x["commit_ms"]
                by[(r["method"], min(place, 7))].append(ms / ar[(r["id"], r["turn"])])
    for (m, place), v in sorted(by.items()):
        label = f"{place}" if place < 7 else "7+"
        print(f"{path}\t{m}\tplace {label}\tn {len(v)}\tmedian {st.median(v):.3f}")
