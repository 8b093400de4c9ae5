#!/usr/bin/env bash
# The third GPU run's DART drafter (this commit's drafters/smollm2-135m-dart, held-out α1 0.764)
# against the second's (536f91c, α1 0.750) on this CPU, new and old interleaved: fixed 8-node
# trees (timing-free tau), then default (adaptive) settings at T = 0 (dart, auto) in two rounds
# with the order swapped, and at T = 1 (dart, auto) once each. The old weights are read from git
# into a PARADRAFT_HOME of their own. Pauses the background campaigns while it runs.
# Later GPU runs reuse it: OUT=<their folder> OLD_REV=<the commit with the weights before> run.sh
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT="${OUT:-docs/results/dart_campaign_bench/2026-11-26-gpu3}"
OLD_REV="${OLD_REV:-536f91c}"
cargo build --release --locked -q
OLD=$(mktemp -d)
mkdir -p "$OLD/drafters/smollm2-135m-dart"
for f in config.json model.safetensors; do
  git show "$OLD_REV:drafters/smollm2-135m-dart/$f" >"$OLD/drafters/smollm2-135m-dart/$f"
done
MODEL="${PARADRAFT_MODEL:-$HOME/.cache/paradraft/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
for m in dart dflash; do PARADRAFT_CAMPAIGN_METHOD=$m scripts/campaign.sh pause || true; done
trap 'for m in dart dflash; do PARADRAFT_CAMPAIGN_METHOD=$m scripts/campaign.sh resume || true; done; rm -rf "$OLD"' EXIT
B="target/release/paradraft bench --model $MODEL --threads 2 --datasets copy,gsm8k,mt_bench,humaneval,math500 --num-prompts 10 --max-new-tokens 128"
$B --fixed-draft --tree-budget 8 --methods dart --out "$OUT/fixed8"
PARADRAFT_HOME=$OLD $B --fixed-draft --tree-budget 8 --methods dart --out "$OUT/fixed8_old"
$B --methods dart,auto --out "$OUT/t0_r1"
PARADRAFT_HOME=$OLD $B --methods dart,auto --out "$OUT/t0_old_r1"
PARADRAFT_HOME=$OLD $B --methods dart,auto --out "$OUT/t0_old_r2"
$B --methods dart,auto --out "$OUT/t0_r2"
$B --methods dart,auto --temperature 1 --seed 0 --out "$OUT/t1"
PARADRAFT_HOME=$OLD $B --methods dart,auto --temperature 1 --seed 0 --out "$OUT/t1_old"
for d in "$OUT"/*/; do [[ -f "$d/runs.jsonl" ]] && gzip -9f "$d/runs.jsonl"; done
