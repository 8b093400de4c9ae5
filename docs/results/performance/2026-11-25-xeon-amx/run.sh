#!/bin/bash
# Every kernel path on a 2-vCPU Intel Xeon with AMX-INT8 (AVX-512 VNNI/BF16/FP16, AVX-VNNI),
# 2026-11-25, from the repository root:
#   LLAMA=path/to/llama-bench bash docs/results/performance/2026-11-25-xeon-amx/run.sh [OUT]
# LLAMA: llama-bench built natively (-DGGML_NATIVE=ON -DLLAMA_CURL=OFF) from the
# llama-cpp-python 0.3.16 sdist. Two interleaved rounds over PATHS, llama.cpp beside the first
# path of each round. Pauses the training campaign while it measures.
# The committed files: PATHS="amx avx512 avxvnni avx2" with the binary of commit 750cea7 (the
# AMX kernel, reverted after; at later commits PARADRAFT_ISA=amx is refused, so the default
# leaves it out). ab_final/: that commit's final kernel against avx512, two interleaved rounds
# of `bench-kernels --threads 2 --repeats 5 --json`. table.py prints the rows.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT="${1:-runs/xeon_paths}"
BIN=${BIN:-./target/release/paradraft}
PATHS=${PATHS:-avx512 avxvnni avx2}
mkdir -p "$OUT"
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
sleep 2
K="bench-kernels --threads 2 --repeats 5 --json"
for r in 1 2; do
  first=1
  for p in $PATHS; do
    if [[ $first == 1 ]]; then
      PARADRAFT_ISA=$p $BIN $K --llama-bench "$LLAMA" > "$OUT/${p}_llama_$r.json"
      first=0
    else
      PARADRAFT_ISA=$p $BIN $K > "$OUT/${p}_$r.json"
    fi
  done
done
