#!/bin/bash
# Every kernel path on a Zen 5 EPYC (AVX-512 VNNI/BF16 and AVX-VNNI), 2026-11-25, from the
# repository root:
#   LLAMA=path/to/llama-bench bash docs/results/performance/2026-11-25-zen5/run.sh [OUT]
# LLAMA: llama-bench built natively (-DGGML_NATIVE=ON -DLLAMA_CURL=OFF) from the
# llama-cpp-python 0.3.16 sdist. Two interleaved rounds over the paths, llama.cpp beside the
# first path of each round. Pauses the training campaign while it measures.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT="${1:-runs/zen5_paths}"
BIN=${BIN:-./target/release/paradraft}
mkdir -p "$OUT"
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
sleep 2
K="bench-kernels --threads 2 --repeats 5 --json"
for r in 1 2; do
  PARADRAFT_ISA=avx512 $BIN $K --llama-bench "$LLAMA" > "$OUT/avx512_llama_$r.json"
  PARADRAFT_ISA=avxvnni $BIN $K > "$OUT/avxvnni_$r.json"
  PARADRAFT_ISA=avx2 $BIN $K > "$OUT/avx2_$r.json"
done
# Speculative decoding at T = 0 beside them (bench_t0/), and the training throughput
# (train campaign --bench 12 --dir /tmp/camp, twice; printed, noted in docs/performance.md).
for r in "" _r2 _r3; do $BIN bench --threads 2 --datasets gsm8k,mt_bench,humaneval,math500 --num-prompts 10 \
  --max-new-tokens 128 --methods pld,dart,auto --temperature 0 --seed 0 --out "$OUT/bench_t0$r"; done
for r in 1 2; do $BIN train campaign --bench 12 --dir /tmp/camp 2>&1 | tail -n 1; done
