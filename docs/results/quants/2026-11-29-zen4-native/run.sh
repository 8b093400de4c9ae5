#!/usr/bin/env bash
# Native six-bit (Q6S: Q6_K, Q3_K) and IQ4-table (Q4T: IQ4_NL, IQ4_XS) kernels against the int8
# expansion they replace (OLD build) and llama.cpp's llama-bench, on random-weight files of
# SmolLM2-1.7B's shape (scripts/quant/random_shape.py → llama-quantize), two interleaved rounds.
# Usage: OLD=/path/old/paradraft NEW=target/release/paradraft LB=/path/llama-bench \
#        MODELS=~/models OUT=/tmp/native bash run.sh        (pause background jobs first)
set -euo pipefail
mkdir -p "$OUT"
for round in 1 2; do
  for t in Q6_K Q4_K_M IQ4_XS Q3_K_M; do
    f="$MODELS/smollm2-1.7b-shape.$t.gguf"
    "$OLD" bench-kernels --model "$f" --repeats 2 --threads 2 --json >"$OUT/old_${t}_$round.json"
    "$NEW" bench-kernels --model "$f" --repeats 2 --threads 2 --llama-bench "$LB" --json >"$OUT/new_${t}_$round.json"
  done
done
