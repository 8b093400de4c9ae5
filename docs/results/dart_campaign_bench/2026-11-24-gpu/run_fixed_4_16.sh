#!/usr/bin/env bash
# Fixed 4- and 16-node DART trees at T = 0 with the GPU-trained drafter (after run.sh, same
# machine, the campaign paused).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=docs/results/dart_campaign_bench/2026-11-24-gpu
cargo build --release --locked -q
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
B="target/release/paradraft bench --threads 2 --datasets gsm8k,mt_bench,humaneval,math500 --num-prompts 10 --max-new-tokens 128"
$B --fixed-draft --tree-budget 4 --methods dart --out "$OUT/fixed4"
$B --fixed-draft --tree-budget 16 --methods dart --out "$OUT/fixed16"
