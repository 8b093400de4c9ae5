"""`auto`'s rounds by whether its model source ran (draft ms > 0.1: the lookups take
microseconds) and what the round verified, against the same run's mean AR round: rounds,
ms per round, tokens committed per round, nodes verified, tokens per AR round's time.
    python3 docs/results/auto/2026-11-26-xeon-gate/model_rounds.py RUN_DIR [RUN_DIR ...]
e.g. docs/results/performance/2026-11-26-xeon-parrows/spec/t1_new_r1 (the build before the gate
timed its rounds) or this folder's t1_new_r1."""
import collections, gzip, json, os, sys


def lines(d):
    p = os.path.join(d, "runs.jsonl")
    return open(p) if os.path.exists(p) else gzip.open(p + ".gz", "rt")


def ms_of(x):
    # As sizer/2026-11-25-xeon/rounds.py: `draft_ms` already holds `select_ms`.
    return x["draft_ms"] + x["tree_ms"] + x["verify_ms"] + x["commit_ms"]


for run in sys.argv[1:]:
    st = collections.defaultdict(lambda: [0, 0.0, 0, 0])
    ar = []
    for r in map(json.loads, lines(run)):
        if r["method"] == "ar":
            ar += [ms_of(x) for x in r["rounds"]]
        if r["method"] != "auto":
            continue
        for x in r["rounds"]:
            src = "model" if x["draft_ms"] > 0.1 else "lookups"
            kind = "drafted" if x["drafted"] else ("cut-empty" if x.get("proposed", 0) else "none")
            s = st[src, kind]
            s[0] += 1
            s[1] += ms_of(x)
            s[2] += x["accepted"] + 1
            s[3] += x["drafted"]
    arm = sum(ar) / len(ar)
    print(f"{run}: mean AR round {arm:.2f} ms")
    for (src, kind), (n, ms, tok, nodes) in sorted(st.items()):
        print(f"  {src:8} {kind:9} rounds {n:5}  {ms / n / arm:.2f}x AR  tokens {tok / n:.2f}"
              f"  nodes {nodes / n:.2f}  tokens per AR time {tok / (ms / arm):.3f}")
