#!/usr/bin/env bash
# Native three-bit (Q3S: Q3_K) and two-bit (Q2S: Q2_K) nibble kernels against what they replace
# (OLD build: Q3_K as six-bit Q6S levels, Q2_K as int8 Q8S levels) and llama.cpp's llama-bench,
# on random-weight files of SmolLM2-1.7B's shape (scripts/quant/random_shape.py → llama-quantize
# --allow-requantize F16 → Q3_K_M / Q3_K_S / Q2_K), two interleaved rounds.
# Usage: OLD=/path/old/paradraft NEW=target/release/paradraft LB=/path/llama-bench \
#        MODELS=~/models OUT=/tmp/lowbit bash run.sh        (pause background jobs first)
set -euo pipefail
mkdir -p "$OUT"
for round in 1 2; do
  for t in Q3_K_M Q3_K_S Q2_K; do
    f="$MODELS/smollm2-1.7b-shape.$t.gguf"
    "$OLD" bench-kernels --model "$f" --repeats 2 --threads 2 --json >"$OUT/old_${t}_$round.json"
    "$NEW" bench-kernels --model "$f" --repeats 2 --threads 2 --llama-bench "$LB" --json >"$OUT/new_${t}_$round.json"
  done
done
