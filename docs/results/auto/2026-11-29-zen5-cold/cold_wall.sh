#!/bin/bash
# Cold processes, wall clock of the whole `paradraft generate` (start to exit) and its decode_ms:
# per prompt AR (the new build), the old build's `auto`, the new build's `auto`, interleaved;
# six held-back prompts (Alpaca items 150-155), 128 new tokens. A fresh $PARADRAFT_HOME with the
# n-gram trie and the model copied in (so no build of either is timed), its guard dir emptied.
#   OUT=dir OLD=bin NEW=bin T=0 bash cold_wall.sh      (pause background jobs first)
set -euo pipefail
: "${OUT:?}" "${OLD:?}" "${NEW:?}" "${T:=0}"
mkdir -p "$OUT"
export PARADRAFT_HOME="$OUT/home"
rm -rf "$PARADRAFT_HOME/guard"; mkdir -p "$PARADRAFT_HOME"
SRC="${SRC_HOME:-$HOME/.cache/paradraft}"
[ -d "$PARADRAFT_HOME/ngram" ] || cp -r "$SRC/ngram" "$PARADRAFT_HOME/"
[ -d "$PARADRAFT_HOME/models" ] || cp -r "$SRC/models" "$PARADRAFT_HOME/"
DATA="$(cd "$(dirname "$0")" && pwd)/../../../../data/bench/alpaca_200.jsonl"
for i in ${PROMPTS:-150 151 152 153 154 155}; do
  p=$(python3 -c "import json,sys; print(json.loads(open('$DATA').readlines()[$i])['turns'][0])")
  for b in none old new; do
    bin=$NEW; d=auto
    case $b in none) d=none ;; old) bin=$OLD ;; esac
    s=$(date +%s.%N)
    "$bin" generate --threads 2 --prompt "$p" --max-new-tokens 128 --temperature "$T" --drafter "$d" --json 2>/dev/null > "$OUT/last.json"
    e=$(date +%s.%N)
    python3 -c "import json; j=json.load(open('$OUT/last.json')); print('$i $b', round(($e-$s)*1000,1), j['stats']['decode_ms'], j['stats']['generated_tokens'])" >> "$OUT/cold_T$T.txt"
  done
done
python3 - "$OUT/cold_T$T.txt" <<'PY'
import sys, statistics as st
from collections import defaultdict
w = defaultdict(dict); d = defaultdict(dict)
for line in open(sys.argv[1]):
    i, b, wall, dec, n = line.split()
    w[i][b] = float(wall); d[i][b] = float(dec)
for b in ("old", "new"):
    rw = [w[i]["none"] / w[i][b] for i in w]
    rd = [d[i]["none"] / d[i][b] for i in d]
    print(f"{b}: wall speedup over AR per prompt {' '.join(f'{x:.2f}' for x in rw)} median {st.median(rw):.3f}; decode-only median {st.median(rd):.3f}")
print("median wall ms:", {b: st.median(w[i][b] for i in w) for b in ("none","old","new")})
PY
