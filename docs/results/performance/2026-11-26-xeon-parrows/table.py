"""c(k) (median ms, all logits / argmax), decode and prefill per run of run.sh (or, given
`avx2`, of `ISA=avx2 run.sh`).
    python3 docs/results/performance/2026-11-26-xeon-parrows/table.py [avx2]"""
import json, os, sys

here = os.path.dirname(os.path.abspath(__file__))
if len(sys.argv) > 1:
    here = os.path.join(here, sys.argv[1])
for run in ["old_r1", "new_r1", "new_r2", "old_r2"]:
    d = json.load(open(os.path.join(here, run + ".json")))
    c = {p["k"]: p for p in d["curve"]}
    ks = sorted(c)
    cells = " ".join(f"c({k}) {c[k]['ms_all_logits']:.2f}/{c[k]['ms_argmax']:.2f}" for k in ks)
    print(f"{run}: decode {d['decode_tok_s']:.0f} tok/s, prefill {d['prefill_tok_s']:.0f} tok/s | {cells}"
          f" | c(4)/c(1) {c[4]['ms_all_logits'] / c[1]['ms_all_logits']:.2f}"
          f" c(16)/c(1) {c[16]['ms_all_logits'] / c[1]['ms_all_logits']:.2f}")
