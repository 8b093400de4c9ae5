#!/usr/bin/env bash
# The GPU-trained DART drafter (this commit's drafters/smollm2-135m-dart) on this CPU: fixed
# 8-node trees (timing-free tau), then default (adaptive) settings at T = 0 and T = 1 beside
# prompt lookup and auto; `run.sh fixed-4-16`: fixed 4- and 16-node trees (run after the rest).
# Pauses THE campaign while it runs.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=docs/results/dart_campaign_bench/2026-11-24-gpu
cargo build --release --locked -q
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
B="target/release/paradraft bench --threads 2 --datasets gsm8k,mt_bench,humaneval,math500 --num-prompts 10 --max-new-tokens 128"
if [[ "${1:-}" == fixed-4-16 ]]; then
  $B --fixed-draft --tree-budget 4 --methods dart --out "$OUT/fixed4"
  $B --fixed-draft --tree-budget 16 --methods dart --out "$OUT/fixed16"
  exit 0
fi
$B --fixed-draft --tree-budget 8 --methods dart --out "$OUT/fixed8"
$B --methods pld,dart,auto --out "$OUT/adaptive_t0"
$B --methods pld,dart,auto --temperature 1 --seed 0 --out "$OUT/adaptive_t1"
