#!/usr/bin/env bash
# DART with and without its n-gram trie (`--no-ngram`: the tree search on the drafter's
# distributions alone), one release binary BIN, interleaved in two rounds with the order
# swapped, T = 0 and T = 1, the five sets × 10 prompts × 128 tokens, each run with its own AR
# baseline. Pauses the training campaign.
#   BIN=target/release/paradraft bash docs/results/dart/2026-11-26-xeon-ngram/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-docs/results/dart/2026-11-26-xeon-ngram}
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
A="bench --threads 2 --datasets copy,gsm8k,mt_bench,humaneval,math500 --num-prompts 10 --max-new-tokens 128 --methods dart"
for round in 1 2; do
  if [[ $round == 1 ]]; then order="trie none"; else order="none trie"; fi
  for t in 0 1; do
    for v in $order; do
      flag=""; [[ $v == none ]] && flag="--no-ngram"
      $BIN $A $flag --temperature $t --seed 0 --out "$OUT/t${t}_${v}_r$round" > /dev/null 2>&1
    done
  done
done
