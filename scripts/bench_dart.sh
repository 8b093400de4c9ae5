#!/usr/bin/env bash
# DART results for docs/dart.md (SmolLM2-135M-Instruct, committed drafters, n-gram trie from the
# README command). Every run measures AR alongside, interleaved.
#   adaptive-t0, adaptive-t1: the default sizing at T = 0 and T = 1 for prompt lookup, DFlash,
#     DFlash-tree and DART on five sets;
#   dart-B: DART with fixed trees of B = 8/16/32/60 nodes; dart-16-no-ngram: without the trie.
# Usage: scripts/bench_dart.sh OUT [N_PROMPTS]
set -euo pipefail
OUT=$1 N=${2:-5}
BIN=${BIN:-./target/release/paradraft}
sets=(--datasets gsm8k,humaneval,mt_bench,math500,mbpp --max-new-tokens 128 --seed 1)
mkdir -p "$OUT"
for t in 0 1; do
  "$BIN" bench --methods pld,dflash,dflash-tree,dart --num-prompts "$N" --temperature "$t" \
    "${sets[@]}" --out "$OUT/adaptive-t$t" > "$OUT/adaptive-t$t.log" 2>&1
done
for b in 8 16 32 60; do
  "$BIN" bench --methods dart --tree-budget "$b" --fixed-draft --num-prompts 3 "${sets[@]}" \
    --out "$OUT/dart-$b" > "$OUT/dart-$b.log" 2>&1
done
"$BIN" bench --methods dart --tree-budget 16 --fixed-draft --no-ngram --num-prompts 3 "${sets[@]}" \
  --out "$OUT/dart-16-no-ngram" > "$OUT/dart-16-no-ngram.log" 2>&1
for d in adaptive-t0 adaptive-t1 dart-8 dart-16 dart-32 dart-60 dart-16-no-ngram; do
  echo "## $d"; cat "$OUT/$d/summary.md"; echo
done > "$OUT/summary.md"
