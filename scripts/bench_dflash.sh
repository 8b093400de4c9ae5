#!/usr/bin/env bash
# DFlash vs prompt lookup vs AR on the four benchmark sets, T = 0 and T = 1 (results in
# docs/dflash.md). Usage: scripts/bench_dflash.sh [NUM_PROMPTS] [MAX_NEW_TOKENS] [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-10}; m=${2:-256}; out=${3:-bench-out/dflash}
cargo build --release -q
bin=./target/release/paradraft
sets=mt_bench,humaneval,gsm8k,math500
# Fixed draft sizes: every method always drafts its maximum (block − 1 for DFlash).
$bin bench --methods pld,dflash --datasets $sets --num-prompts "$n" --max-new-tokens "$m" \
  --fixed-draft --out "$out/t0"
$bin bench --methods pld,dflash,dflash-sample --datasets $sets --num-prompts "$n" \
  --max-new-tokens "$m" --temperature 1 --fixed-draft --out "$out/t1"
# Ablation: the block-16 drafter run with block 8.
$bin bench --methods dflash --block-size 8 --datasets $sets --num-prompts "$n" \
  --max-new-tokens "$m" --fixed-draft --out "$out/t0-block8"
