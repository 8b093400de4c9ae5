#!/usr/bin/env bash
# PARD results for docs/pard.md (SmolLM2-135M-Instruct, committed drafters, the README's n-gram
# trie and ARPA model). Every run measures AR alongside, interleaved.
#   adaptive-t0, adaptive-t1: the default sizing at T = 0 and T = 1 for prompt lookup, DFlash,
#     DART and PARD (chain, sampled chain at T = 1, tree) on four sets;
#   pard-kK: fixed chains of K = 4/8/12/16 (PARD's K_infer sweep; trained with K = 8);
#   pard-cps-8: DiffuSpec's path search over PARD's block of 8 with the 3-gram proxy.
# Usage: scripts/bench_pard.sh OUT [N_PROMPTS]
set -euo pipefail
OUT=$1 N=${2:-5}
BIN=${BIN:-./target/release/paradraft}
sets=(--datasets gsm8k,humaneval,math500,mt_bench --max-new-tokens 128 --seed 1)
mkdir -p "$OUT"
"$BIN" bench --methods pld,dflash,dart,pard,pard-tree --num-prompts "$N" --temperature 0 \
  "${sets[@]}" --out "$OUT/adaptive-t0" > "$OUT/adaptive-t0.log" 2>&1
"$BIN" bench --methods pld,dflash,dart,pard,pard-sample --num-prompts "$N" --temperature 1 \
  "${sets[@]}" --out "$OUT/adaptive-t1" > "$OUT/adaptive-t1.log" 2>&1
for k in 4 8 12 16; do
  "$BIN" bench --methods pard --fixed-draft --num-speculative-tokens "$k" --num-prompts 3 \
    "${sets[@]}" --out "$OUT/pard-k$k" > "$OUT/pard-k$k.log" 2>&1
done
"$BIN" bench --methods pard --fixed-draft --num-speculative-tokens 8 --cps \
  --ngram-arpa data/ngram/smollm2-135m.arpa --num-prompts 3 "${sets[@]}" \
  --out "$OUT/pard-cps-8" > "$OUT/pard-cps-8.log" 2>&1
for d in adaptive-t0 adaptive-t1 pard-k4 pard-k8 pard-k12 pard-k16 pard-cps-8; do
  echo "## $d"; cat "$OUT/$d/summary.md"; echo
done > "$OUT/summary.md"
