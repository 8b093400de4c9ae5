#!/bin/bash
# Sizing learns batched forwards' cost: OLD (a build of aafa59c) against NEW (this commit's),
# interleaved, campaign paused, from the repository root:
#   OLD=path/to/old/paradraft NEW=target/release/paradraft bash docs/results/auto/2026-11-25-batch-cost/run.sh [OUT]
# r8_*: default requests per level (8 / 8 / 32 at 1 / 4 / 16 streams); r48_*: 48 per level.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT="${1:-runs/batch_cost}"
NEW=$(realpath "${NEW:-target/release/paradraft}")
OLD=$(realpath "${OLD:?the build before}")
mkdir -p "$OUT"
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
sleep 1
for r in 1 2 3; do for b in old new; do
  bin=$OLD; [ $b = new ] && bin=$NEW
  python3 scripts/bench_serve.py --bin "$bin" --methods none,auto --concurrency 1,4,16 \
    --max-tokens 128 --out "$OUT/r8_${b}_$r"
done; done
for r in 1 2 3; do for b in old new; do
  bin=$OLD; [ $b = new ] && bin=$NEW
  python3 scripts/bench_serve.py --bin "$bin" --methods none,auto --concurrency 4,16 \
    --requests 48 --max-tokens 128 --out "$OUT/r48_${b}_$r"
done; done
# r24c1_*: one stream, 24 requests (a lone session: the change should not matter there).
for r in 1 2; do for b in old new; do
  bin=$OLD; [ $b = new ] && bin=$NEW
  python3 scripts/bench_serve.py --bin "$bin" --methods none,auto --concurrency 1 \
    --requests 24 --max-tokens 128 --out "$OUT/r24c1_${b}_$r"
done; done
