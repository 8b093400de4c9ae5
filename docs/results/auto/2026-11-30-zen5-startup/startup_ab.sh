#!/bin/bash
# Start-up and whole-run wall clock of fresh `paradraft generate` processes, two builds
# interleaved, AR (`--drafter none`) and `auto` each:
#   1. to one token (`--prompt Hi --max-new-tokens 1`), REPS rounds of none/dart/auto per build;
#   2. six held-back prompts (Alpaca items 150-155), 128 new tokens, at T (default 0 and 1).
# A fresh $PARADRAFT_HOME with the n-gram trie and the model copied in; each build's kept cost
# curves measured once by a warm-up before the timed runs (as a second run of a build finds them).
#   OUT=dir OLD=bin NEW=bin bash startup_ab.sh      (pause background jobs first)
set -euo pipefail
: "${OUT:?}" "${OLD:?}" "${NEW:?}"
mkdir -p "$OUT"
export PARADRAFT_HOME="$OUT/home"
rm -rf "$PARADRAFT_HOME/guard"; mkdir -p "$PARADRAFT_HOME"
SRC="${SRC_HOME:-$HOME/.cache/paradraft}"
[ -d "$PARADRAFT_HOME/ngram" ] || cp -r "$SRC/ngram" "$PARADRAFT_HOME/"
[ -d "$PARADRAFT_HOME/models" ] || cp -r "$SRC/models" "$PARADRAFT_HOME/"
DATA="$(cd "$(dirname "$0")" && pwd)/../../../../data/bench/alpaca_200.jsonl"
ms() { python3 -c "print(round(($2-$1)*1000,1))"; }
for bin in "$OLD" "$NEW"; do for d in dart auto; do for t in 0 1; do
  "$bin" generate --threads 2 --prompt Hi --max-new-tokens 4 --temperature $t --drafter $d >/dev/null 2>&1
done; done; done
: > "$OUT/first_token.txt"
for r in $(seq "${REPS:-6}"); do for b in old new; do for d in none dart auto; do
  bin=$OLD; [ $b = new ] && bin=$NEW
  s=$(date +%s.%N); "$bin" generate --threads 2 --prompt Hi --max-new-tokens 1 --drafter $d >/dev/null 2>&1; e=$(date +%s.%N)
  echo "$b $d $(ms $s $e)" >> "$OUT/first_token.txt"
done; done; done
for T in ${TEMPS:-0 1}; do
  : > "$OUT/wall_T$T.txt"
  for i in ${PROMPTS:-150 151 152 153 154 155}; do
    p=$(python3 -c "import json,sys; print(json.loads(open('$DATA').readlines()[$i])['turns'][0])")
    for b in old new; do for d in none auto; do
      bin=$OLD; [ $b = new ] && bin=$NEW
      s=$(date +%s.%N)
      "$bin" generate --threads 2 --prompt "$p" --max-new-tokens 128 --temperature "$T" --drafter "$d" --json 2>/dev/null > "$OUT/last.json"
      e=$(date +%s.%N)
      python3 -c "import json; j=json.load(open('$OUT/last.json')); print('$i $b $d', round(($e-$s)*1000,1), j['stats']['decode_ms'], j['stats']['generated_tokens'])" >> "$OUT/wall_T$T.txt"
    done; done
  done
done
python3 - "$OUT" <<'PY'
import sys, glob, os, statistics as st
from collections import defaultdict
out = sys.argv[1]
ft = defaultdict(list)
for line in open(os.path.join(out, "first_token.txt")):
    b, d, v = line.split(); ft[(b, d)].append(float(v))
print("to one token, ms (min / median):", {f"{b} {d}": (min(v), st.median(v)) for (b, d), v in sorted(ft.items())})
for f in sorted(glob.glob(os.path.join(out, "wall_T*.txt"))):
    w = defaultdict(dict)
    for line in open(f):
        i, b, d, wall, dec, n = line.split(); w[i][(b, d)] = float(wall)
    med = {f"{b} {d}": st.median(w[i][(b, d)] for i in w) for b in ("old", "new") for d in ("none", "auto")}
    r = {b: st.median(w[i][(b, "none")] / w[i][(b, "auto")] for i in w) for b in ("old", "new")}
    print(os.path.basename(f), "median wall ms", med, "auto/AR per build (median of prompts)", r)
PY
