"""One row per bench-kernels JSON in this folder (or the folder given): the table of
docs/performance.md's Xeon section."""
import glob, json, os, sys

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
print("| run | decode tok/s | prefill 512 tok/s | c(1) ms | c(2) | c(4) | c(8) | c(16) | c(32) | c(16)/c(1) | same, from minima | GMAC/s at 16 | llama.cpp tg128 / pp512 |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for f in sorted(glob.glob(os.path.join(d, "*.json"))):
    r = json.load(open(f))
    c = {p["k"]: p for p in r["curve"]}
    ms = lambda k: c[k]["ms_all_logits"]
    mn = lambda k: c[k]["min_ms_all_logits"]
    ll = r.get("llama_cpp") or {}
    lls = f"{ll['tg128_tok_s']:.1f} / {ll['pp512_tok_s']:.1f}" if ll else ""
    print(f"| {os.path.basename(f)[:-5]} | {r['decode_tok_s']:.1f} | {r['prefill_tok_s']:.0f} | {ms(1):.2f} | "
          + " | ".join(f"{ms(k):.2f}" for k in (2, 4, 8, 16, 32))
          + f" | {ms(16)/ms(1):.2f} | {mn(16)/mn(1):.2f} | {c[16]['gmac_s']:.0f} | {lls} |")
