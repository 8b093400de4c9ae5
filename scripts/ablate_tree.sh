#!/usr/bin/env bash
# DFlash-tree ablations at T = 0 with fixed draft sizes: the chain (dflash, block 16) against
# searched trees of 4/8/16/32/60 nodes with the n-gram trie, and 16 nodes without it.
# Each run measures AR alongside (interleaved). Usage: scripts/ablate_tree.sh OUT [N_PROMPTS]
set -euo pipefail
OUT=$1 N=${2:-3}
BIN=${BIN:-./target/release/paradraft}
common=(--datasets gsm8k,humaneval,mt_bench,math500 --num-prompts "$N" --max-new-tokens 128 --fixed-draft)
mkdir -p "$OUT"
"$BIN" bench --methods dflash --num-speculative-tokens 15 "${common[@]}" --out "$OUT/chain" > "$OUT/chain.log" 2>&1
for b in 4 8 16 32 60; do
  "$BIN" bench --methods dflash-tree --tree-budget "$b" "${common[@]}" --out "$OUT/tree-$b" > "$OUT/tree-$b.log" 2>&1
done
"$BIN" bench --methods dflash-tree --tree-budget 16 --no-ngram "${common[@]}" --out "$OUT/tree-16-no-ngram" > "$OUT/tree-16-no-ngram.log" 2>&1
for d in chain tree-4 tree-8 tree-16 tree-32 tree-60 tree-16-no-ngram; do
  echo "## $d"; grep -v "| ar |" "$OUT/$d/summary.md" | tail -n +3
done > "$OUT/summary.md"
