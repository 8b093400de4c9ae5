"""A bench run's rounds, for the numbers docs/auto.md ("The sizer on a truthful verify curve")
and the sizer's comments cite:
  - the startup verify curve (summary.json's verify_curve) as multiples of c(1);
  - per method: rounds, undrafted rounds by reason split into asked (a proposal cut to
    nothing) and not asked, and drafted rounds by size (time over the mean AR round, accepted
    nodes, gain = tokens per time over AR's);
  - per method, round i's mean time over the steady AR round (AR rounds 5 on) and the share
    of rounds i that drafted.
    python3 docs/results/sizer/2026-11-25-xeon-explore/why.py RUN_DIR [DATASET]"""
import collections, gzip, json, os, statistics as st, sys

d = sys.argv[1]
only = sys.argv[2] if len(sys.argv) > 2 else None
p = os.path.join(d, "runs.jsonl")
runs = [json.loads(l) for l in (open(p) if os.path.exists(p) else gzip.open(p + ".gz", "rt"))]
runs = [r for r in runs if only is None or r["dataset"] == only]
curve = json.load(open(os.path.join(d, "summary.json"))).get("verify_curve")
if curve:
    print("verify curve over c(1): " + ", ".join(f"c({r}) {ms / curve[0][1]:.2f}" for r, ms in curve))
tot = lambda x: x["draft_ms"] + x["tree_ms"] + x["verify_ms"] + x["commit_ms"]
ar_all = [x for r in runs if r["method"] == "ar" for x in r["rounds"]]
ar = st.mean(map(tot, ar_all))
steady = st.mean(tot(x) for r in runs if r["method"] == "ar" for x in r["rounds"][5:])
print(f"{d} {only or 'all sets'}: mean AR round {ar:.2f} ms, steady (rounds 5 on) {steady:.2f} ms")
for m in ["ar"] + sorted({r["method"] for r in runs} - {"ar"}):
    rs = [r for r in runs if r["method"] == m]
    rounds = [x for r in rs for x in r["rounds"]]
    if m != "ar":
        why = collections.Counter(
            (x.get("undrafted"), "asked" if x.get("proposed", 0) > 0 else "not asked")
            for x in rounds if x["drafted"] == 0)
        size = collections.defaultdict(list)
        for x in rounds:
            if x["drafted"] > 0:
                size[x["drafted"]].append(x)
        print(f"  {m}: {len(rounds)} rounds; undrafted " + ", ".join(f"{k[0]} {k[1]} {n}" for k, n in sorted(why.items(), key=str)))
        cells = []
        for n, xs in sorted(size.items()):
            if len(xs) >= 10:
                c = st.mean(map(tot, xs)) / ar
                a = st.mean(x["accepted"] for x in xs)
                cells.append(f"{n}: {len(xs)}, {c:.2f}x AR, {a:.2f} accepted, gain {(1 + a) / c:.2f}")
        print("    drafted " + "; ".join(cells))
    line = []
    for i in list(range(8)) + [10, 20, 30, 40]:
        xs = [r["rounds"][i] for r in rs if len(r["rounds"]) > i]
        if xs:
            line.append(f"{i}: {st.mean(map(tot, xs)) / steady:.2f}/{st.mean(x['drafted'] > 0 for x in xs):.2f}")
    print(f"    {m} round i: time over steady AR / share drafted  " + "  ".join(line))
