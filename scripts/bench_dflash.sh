#!/usr/bin/env bash
# DFlash vs prompt lookup vs AR on the four benchmark sets (the runs behind docs/dflash.md).
# Usage: scripts/bench_dflash.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-out/dflash}
cargo build --release -q
bin=./target/release/paradraft
sets=mt_bench,humaneval,gsm8k,math500
# T = 0, fixed draft sizes: every method always drafts its maximum (block − 1 = 15 for DFlash).
$bin bench --methods pld,dflash --datasets $sets --num-prompts 10 --max-new-tokens 128 \
  --fixed-draft --out "$out/t0"
# T = 1: greedy drafts (one-hot q) against sampled drafts (q known). Fewer prompts: sampling
# verification builds a full-vocabulary distribution per verified row, which is slow.
$bin bench --methods pld,dflash,dflash-sample --datasets $sets --num-prompts 3 \
  --max-new-tokens 128 --temperature 1 --fixed-draft --out "$out/t1"
# Ablation: the block-16 drafter run with block 8.
$bin bench --methods dflash --block-size 8 --datasets $sets --num-prompts 5 \
  --max-new-tokens 128 --fixed-draft --out "$out/t0-block8"
# The default: adaptive draft sizing from the measured verify-cost curve and acceptance.
$bin bench --methods pld,dflash --datasets $sets --num-prompts 5 --max-new-tokens 128 \
  --out "$out/t0-adaptive"
