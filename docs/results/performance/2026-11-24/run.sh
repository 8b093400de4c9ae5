#!/bin/bash
# The kernel-path runs of docs/performance.md (2026-11-24), from the repository root:
#   OLD_BIN=path/to/paradraft-before LLAMA_AVX2=path/to/llama-bench LLAMA_NATIVE=path/to/llama-bench \
#     bash docs/results/performance/2026-11-24/run.sh [OUT]
# OLD_BIN: a release build of commit 03da96a (before the AVX2 work); LLAMA_*: llama-bench built from
# the llama-cpp-python sdist natively and AVX2-only (flags in docs/performance.md).
# Pauses the training campaign while it measures.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT="${1:-runs/kernel_paths}"
NEW=./target/release/paradraft
mkdir -p "$OUT"
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
sleep 2
K="bench-kernels --threads 2 --repeats 5 --json"
for r in 1 2; do
  "$OLD_BIN" $K > "$OUT/old_avx512_$r.json"
  $NEW $K > "$OUT/new_avx512_$r.json"
done
PARADRAFT_ISA=avx2 $NEW $K --llama-bench "$LLAMA_AVX2" > "$OUT/avx2_llama.json"
PARADRAFT_ISA=avxvnni $NEW $K > "$OUT/avxvnni.json"
$NEW $K --llama-bench "$LLAMA_NATIVE" > "$OUT/avx512_llama.json"
PARADRAFT_ISA=avx2 "$OLD_BIN" $K > "$OUT/old_avx2.json"
# After the two-chain VNNI change (b7cb757): avxvnni and avx2 once more.
for isa in avxvnni avx2 avxvnni; do  # the committed v2_avxvnni.json is the second avxvnni run
  PARADRAFT_ISA=$isa $NEW $K > "$OUT/v2_$isa.json"
done
