"""Per run of run.sh (or, given `avx2`, of `ISA=avx2 run.sh`): decode and prefill tok/s, and
c(k) median ms (argmax output; the body alone, no output layer, in brackets) at each context.
    python3 docs/results/performance/2026-11-26-xeon-shared-kv/table.py [avx2]"""
import json, os, sys

here = os.path.dirname(os.path.abspath(__file__))
if len(sys.argv) > 1:
    here = os.path.join(here, sys.argv[1])
for ctx in [64, 320]:
    for run in ["old_r1", "new_r1", "new_r2", "old_r2"]:
        v, r = run.split("_")
        d = json.load(open(os.path.join(here, f"{v}_c{ctx}_{r}.json")))
        c = {p["k"]: p for p in d["curve"]}
        cells = " ".join(f"c({k}) {c[k]['ms_argmax']:.2f} [{c[k]['ms_no_output']:.2f}]" for k in sorted(c))
        print(f"ctx {ctx} {run}: decode {d['decode_tok_s']:.0f}, prefill {d['prefill_tok_s']:.0f} | {cells}"
              f" | c(16)/c(1) {c[16]['ms_argmax'] / c[1]['ms_argmax']:.2f}")
