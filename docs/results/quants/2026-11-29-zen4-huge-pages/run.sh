#!/usr/bin/env bash
# Packed weights on transparent huge pages (runtime/qmatmul/buf.rs) against the build before
# (OLD: the same kernels on 4 KiB pages) and llama.cpp's llama-bench, on random-weight files of
# SmolLM2-1.7B's shape (scripts/quant/random_shape.py → llama-quantize --allow-requantize F16 →
# Q6_K / Q4_K_M), two interleaved rounds.
# Usage: OLD=/path/old/paradraft NEW=target/release/paradraft LB=/path/llama-bench \
#        MODELS=~/models OUT=/tmp/huge bash run.sh        (pause background jobs first)
set -euo pipefail
mkdir -p "$OUT"
for round in 1 2; do
  for t in Q6_K Q4_K_M; do
    f="$MODELS/smollm2-1.7b-shape.$t.gguf"
    "$OLD" bench-kernels --model "$f" --repeats 2 --threads 2 --json >"$OUT/old_${t}_$round.json"
    "$NEW" bench-kernels --model "$f" --repeats 2 --threads 2 --llama-bench "$LB" --json >"$OUT/new_${t}_$round.json"
  done
done
