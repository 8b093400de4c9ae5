"""The startup verify curves (summary.json's verify_curve) of every run of this session's sizer
A/Bs, old builds against new: c(1), c(2) in ms and c(k)/c(1), min-max over the runs.
    python3 docs/results/sizer/2026-11-25-xeon-explore/curves.py"""
import glob, json, os

here = os.path.dirname(os.path.abspath(__file__))
for v in ["old", "new"]:
    fs = sorted(set(glob.glob(os.path.join(here, "..", "2026-11-25-xeon-*", "**", f"t*_{v}_*", "summary.json"), recursive=True)))
    cs = [dict(json.load(open(f))["verify_curve"]) for f in fs]
    span = lambda xs: f"{min(xs):.2f}-{max(xs):.2f}"
    print(f"{v}: {len(cs)} runs; c(1) {span([c[1] for c in cs])} ms, c(2) {span([c[2] for c in cs])} ms; "
          + ", ".join(f"c({k})/c(1) {span([c[k] / c[1] for c in cs])}" for k in (2, 4, 8))
          + f"; runs with c(2) < c(1): {sum(c[2] < c[1] for c in cs)}")
