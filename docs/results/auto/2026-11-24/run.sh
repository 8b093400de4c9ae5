#!/usr/bin/env bash
# auto against each source alone and AR: the four bench sets plus the copy-heavy one, T = 0 and
# T = 1, 10 prompts each, 128 new tokens, 3 repeats (each a full bench run with its own AR
# baseline), then the serving benchmark. Run from the repository root with the campaign paused:
#   scripts/campaign.sh pause; docs/results/auto/2026-11-24/run.sh OUT; scripts/campaign.sh resume
set -euo pipefail
OUT=${1:?output dir}
B=${BIN:-target/release/paradraft}
mkdir -p "$OUT"
for rep in 1 2 3; do
  for t in 0 1; do
    "$B" bench --threads 2 --temperature $t --methods pld,dart,auto \
      --datasets copy,gsm8k,mt_bench,humaneval,math500 --num-prompts 10 --max-new-tokens 128 \
      --out "$OUT/t$t-r$rep" > /dev/null 2> "$OUT/t$t-r$rep.log"
  done
done
python3 scripts/bench_serve.py --methods none,pld,auto --concurrency 1,4,16 --max-tokens 128 \
  --out "$OUT/serve" > "$OUT/serve.log" 2>&1
