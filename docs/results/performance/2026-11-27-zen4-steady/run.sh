#!/usr/bin/env bash
# Every forced kernel path this CPU runs, interleaved rounds of bench-kernels (steady-state c(k)).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT="$(dirname "$0")"; M="${MODEL:-$HOME/.cache/paradraft/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
for r in 1 2; do
  for isa in avx512 avx2 avxvnni; do
    PARADRAFT_ISA=$isa target/release/paradraft bench-kernels --model "$M" --threads 2 --repeats 5 --json > "$OUT/${isa}_r$r.json"
  done
done
