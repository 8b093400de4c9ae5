#!/bin/bash
# Every kernel path on a 2-vCPU Intel Xeon with AMX-INT8 (AVX-512 VNNI/BF16/FP16, AVX-VNNI),
# 2026-11-25, from the repository root:
#   LLAMA=path/to/llama-bench bash docs/results/performance/2026-11-25-xeon-amx/run.sh [OUT]
# LLAMA: llama-bench built natively (-DGGML_NATIVE=ON -DLLAMA_CURL=OFF) from the
# llama-cpp-python 0.3.16 sdist. Two interleaved rounds over the paths (amx, the default here,
# then avx512, avxvnni, avx2), llama.cpp beside the first path of each round. Pauses the
# training campaign while it measures.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT="${1:-runs/xeon_paths}"
BIN=${BIN:-./target/release/paradraft}
mkdir -p "$OUT"
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
sleep 2
K="bench-kernels --threads 2 --repeats 5 --json"
for r in 1 2; do
  PARADRAFT_ISA=amx $BIN $K --llama-bench "$LLAMA" > "$OUT/amx_llama_$r.json"
  PARADRAFT_ISA=avx512 $BIN $K > "$OUT/avx512_$r.json"
  PARADRAFT_ISA=avxvnni $BIN $K > "$OUT/avxvnni_$r.json"
  PARADRAFT_ISA=avx2 $BIN $K > "$OUT/avx2_$r.json"
done
