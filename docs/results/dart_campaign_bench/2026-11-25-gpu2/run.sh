#!/usr/bin/env bash
# The second GPU run's DART drafter (this commit's drafters/smollm2-135m-dart, held-out α1 0.750)
# against the first's (11e94a2, α1 0.726) on this CPU, new and old interleaved: fixed 8-node
# trees (timing-free tau), then default (adaptive) settings at T = 0 (pld, dart, auto) and at
# T = 1 (dart, auto). The old weights are read from git into a PARADRAFT_HOME of their own.
# `run.sh repeat`: the T = 0 pair again, old first (run after the rest).
# Pauses the background campaigns while it runs.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=docs/results/dart_campaign_bench/2026-11-25-gpu2
OLD_REV=11e94a2
cargo build --release --locked -q
OLD=$(mktemp -d)
mkdir -p "$OLD/drafters/smollm2-135m-dart"
for f in config.json model.safetensors; do
  git show "$OLD_REV:drafters/smollm2-135m-dart/$f" >"$OLD/drafters/smollm2-135m-dart/$f"
done
MODEL="${PARADRAFT_MODEL:-$HOME/.cache/paradraft/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
for m in dart dflash; do PARADRAFT_CAMPAIGN_METHOD=$m scripts/campaign.sh pause || true; done
trap 'for m in dart dflash; do PARADRAFT_CAMPAIGN_METHOD=$m scripts/campaign.sh resume || true; done; rm -rf "$OLD"' EXIT
B="target/release/paradraft bench --model $MODEL --threads 2 --datasets gsm8k,mt_bench,humaneval,math500 --num-prompts 10 --max-new-tokens 128"
if [[ "${1:-}" == repeat ]]; then
  PARADRAFT_HOME=$OLD $B --methods dart,auto --out "$OUT/adaptive_t0_old_r2"
  $B --methods pld,dart,auto --out "$OUT/adaptive_t0_r2"
  exit 0
fi
$B --fixed-draft --tree-budget 8 --methods dart --out "$OUT/fixed8"
PARADRAFT_HOME=$OLD $B --fixed-draft --tree-budget 8 --methods dart --out "$OUT/fixed8_old"
$B --methods pld,dart,auto --out "$OUT/adaptive_t0"
PARADRAFT_HOME=$OLD $B --methods dart,auto --out "$OUT/adaptive_t0_old"
$B --methods dart,auto --temperature 1 --seed 0 --out "$OUT/adaptive_t1"
