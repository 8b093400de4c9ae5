#!/bin/bash
# Cold `paradraft generate` (a fresh process per request) against AR, interleaved per prompt:
# six held-back prompts (Alpaca items 150–155, not in any bench run or training set), 128 new
# tokens, each prompt with `--drafter none`, then each build's default (`auto`).
#   OUT=dir OLD=bin NEW=bin T=1 bash cold.sh
# The new build keeps its speed guard between processes under $PARADRAFT_HOME/guard, emptied
# first: the first request of the run learns on its own, the later ones start from it.
set -euo pipefail
: "${OUT:?}" "${OLD:?}" "${NEW:?}" "${T:=1}"
mkdir -p "$OUT"
export PARADRAFT_HOME="$OUT/home"
rm -rf "$PARADRAFT_HOME/guard"
MODEL="${MODEL:-$HOME/.cache/paradraft/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
DATA="$(dirname "$0")/../../../../data/bench/alpaca_200.jsonl"
for i in 150 151 152 153 154 155; do
  p=$(python3 -c "import json,sys; print(json.loads(open('$DATA').readlines()[$i])['turns'][0])")
  for b in none old new; do
    bin=$NEW; d=auto
    case $b in none) d=none ;; old) bin=$OLD ;; esac
    "$bin" generate --model "$MODEL" --threads 2 --prompt "$p" --max-new-tokens 128 \
      --temperature "$T" --drafter "$d" --json 2>/dev/null |
      python3 -c "import json,sys; j=json.load(sys.stdin); print('$i $b', j['stats']['decode_ms'], j.get('tau', 1.0))" >> "$OUT/cold_T$T.txt"
  done
done
python3 - "$OUT/cold_T$T.txt" <<'PY'
import sys, statistics as st
from collections import defaultdict
ms = defaultdict(dict)
for line in open(sys.argv[1]):
    i, b, d, tau = line.split()
    ms[i][b] = float(d)
for b in ("old", "new"):
    r = [ms[i]["none"] / ms[i][b] for i in ms]
    print(f"{b}: speedup over AR per prompt {' '.join(f'{x:.2f}' for x in r)}; median {st.median(r):.3f}, geomean {st.geometric_mean(r):.3f}")
PY
