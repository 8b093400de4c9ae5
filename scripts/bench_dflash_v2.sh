#!/usr/bin/env bash
# The runs behind docs/dflash.md "Training at scale": a new DFlash drafter against the previous
# one, prompt lookup and AR on the four benchmark sets, with the default adaptive draft sizing
# (each round's size from the measured verify-cost and draft-cost curves and the acceptance so
# far). Every method's AR baseline is interleaved per prompt in the same invocation.
# Usage: scripts/bench_dflash_v2.sh NEW_DRAFTER OLD_DRAFTER [OUT]
set -euo pipefail
new=$1 old=$2 out=${3:-bench-out/dflash-v2}
bin=${BIN:-./target/release/paradraft}
sets=mt_bench,humaneval,gsm8k,math500
$bin bench --methods pld,dflash --draft-model "$new" --datasets $sets --num-prompts 10 \
  --max-new-tokens 128 --out "$out/t0-new"
$bin bench --methods dflash --draft-model "$old" --datasets $sets --num-prompts 10 \
  --max-new-tokens 128 --out "$out/t0-old"
$bin bench --methods pld,dflash-sample --draft-model "$new" --datasets $sets --num-prompts 5 \
  --max-new-tokens 128 --temperature 1 --out "$out/t1-new"
