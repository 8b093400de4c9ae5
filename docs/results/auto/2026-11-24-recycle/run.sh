#!/usr/bin/env bash
# auto with and without the recycled-candidates source, interleaved: per repeat, one bench of
# pld and auto (default sources) and one of auto with recycle added, each with its own AR
# baseline; T = 0 three repeats (a-t0-r*, b-t0-r*), T = 1 one (a-t1-r1, b-t1-r1). Run from the
# repository root with the campaign paused:
#   scripts/campaign.sh pause; docs/results/auto/2026-11-24-recycle/run.sh OUT; scripts/campaign.sh resume
set -euo pipefail
OUT=${1:?output dir}
B=${BIN:-target/release/paradraft}
SETS=copy,gsm8k,mt_bench,humaneval,math500
mkdir -p "$OUT"
run() { # T repeat
  "$B" bench --threads 2 --temperature "$1" --methods pld,auto --datasets $SETS --num-prompts 10 \
    --max-new-tokens 128 --out "$OUT/a-t$1-r$2" > /dev/null 2> "$OUT/a-t$1-r$2.log"
  "$B" bench --threads 2 --temperature "$1" --methods auto --sources pld,suffix,trie,dart,recycle \
    --datasets $SETS --num-prompts 10 --max-new-tokens 128 --out "$OUT/b-t$1-r$2" > /dev/null 2> "$OUT/b-t$1-r$2.log"
}
for rep in 1 2 3; do run 0 $rep; done
run 1 1
