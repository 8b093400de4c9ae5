#!/usr/bin/env bash
# Output rows on demand in batches (docs/performance.md, "Output rows on demand"): OLD and NEW
# release binaries (the build before and after), interleaved in two rounds with the order
# swapped, `paradraft serve` with none / pld / auto at 4 and 16 streams, 48 requests per level,
# 128 tokens, T = 0. Pauses the training campaign.
#   OLD=/tmp/old NEW=/tmp/new bash docs/results/performance/2026-11-26-xeon-rows-on-demand/serve.sh
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-docs/results/performance/2026-11-26-xeon-rows-on-demand/serve}
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
for round in 1 2; do
  if [[ $round == 1 ]]; then order="old new"; else order="new old"; fi
  for v in $order; do
    bin=$OLD; [[ $v == new ]] && bin=$NEW
    python3 scripts/bench_serve.py --bin "$bin" --methods none,pld,auto --concurrency 4,16 \
      --requests 48 --max-tokens 128 --out "$OUT/${v}_r$round" > /dev/null
  done
done
