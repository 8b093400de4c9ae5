#!/usr/bin/env bash
# DART at fixed depths before the depth learner (docs/dart.md, "How deep to draft"): the
# committed drafter with --block-size 8 (its trained 7 masks), 5, 4 and 3, T = 0, four sets ×
# 10 prompts × 128 tokens, each run with its own AR baseline, two rounds. BIN: a release
# binary built before the learner (at 419fc4b); with a later one, --block-size is only the
# cap. Pauses the training campaign.
#   BIN=/tmp/old bash docs/results/dart/2026-11-26-xeon-depth/blocksize/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../../../.."
OUT=${OUT:-docs/results/dart/2026-11-26-xeon-depth/blocksize}
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
for round in 1 2; do
  for bs in 8 5 4 3; do
    $BIN bench --threads 2 --methods dart --block-size $bs --datasets gsm8k,mt_bench,humaneval,math500 \
      --num-prompts 10 --out "$OUT/t0_${bs}_$round" > /dev/null 2>&1
  done
done
