#!/bin/bash
# DART before/after the campaign's weights (issue #23 item 6), from the repository root:
#   bash docs/results/dart_campaign_bench/2026-11-24/run.sh [OUT]
# "before" is the drafter of commit 03da96a (held-out alpha1 0.486), "after" the committed one.
# Pauses the training campaign while it measures.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT="${1:-runs/dart_bench}"
B=./target/release/paradraft
OLD="$OUT/dart_before"
mkdir -p "$OLD"
for f in model.safetensors config.json eval.json; do
  git show "03da96a:drafters/smollm2-135m-dart/$f" > "$OLD/$f"
done
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
sleep 2
for T in 0 1; do
  $B bench --methods dart,pld --temperature $T --seed 1 --out "$OUT/new_t$T"
  $B bench --methods dart --draft-model "$OLD" --temperature $T --seed 1 --out "$OUT/old_t$T"
done
$B bench --methods dart --fixed-draft --tree-budget 8 --out "$OUT/new_fixed8"
$B bench --methods dart --fixed-draft --tree-budget 8 --draft-model "$OLD" --out "$OUT/old_fixed8"
