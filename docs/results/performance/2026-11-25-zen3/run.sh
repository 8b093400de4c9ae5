#!/bin/bash
# The Zen 3 (AVX2 only) runs of docs/performance.md (2026-11-25), from the repository root:
#   LLAMA=path/to/llama-bench [TILE16_BIN=path/to/paradraft-16-row-tiles] [OLD_BIN=path/to/a2764b9-build] \
#     bash docs/results/performance/2026-11-25-zen3/run.sh [OUT]
# LLAMA: llama-bench built natively (-DGGML_NATIVE=ON -DLLAMA_CURL=OFF) from the
# llama-cpp-python 0.3.16 sdist. This tree's build gave quiet_llama.json and bench_t0/ (first,
# on a quiet machine) and tile4_*.json; TILE16_BIN, a build with Q4 weights in 16-row AVX2 tiles
# (MADDUBS_TILE = 16 for Q4_0/Q4_1, Q8_0 kept at 4), gave tile16_*.json, interleaved with them.
# Pauses the training campaign while it measures.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT="${1:-runs/zen3_paths}"
NEW=./target/release/paradraft
mkdir -p "$OUT"
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
sleep 2
if grep -q -m1 avx512f /proc/cpuinfo; then echo "note: this CPU has AVX-512" >&2; fi
K="bench-kernels --threads 2 --repeats 5 --json"
$NEW $K --llama-bench "$LLAMA" > "$OUT/quiet_llama.json"
$NEW bench --threads 2 --datasets gsm8k,mt_bench,humaneval,math500 --num-prompts 10 \
  --max-new-tokens 128 --methods pld,dart,auto --temperature 0 --seed 0 --out "$OUT/bench_t0"
if [[ -n "${TILE16_BIN:-}" ]]; then
  for r in 1 2; do
    $NEW $K > "$OUT/tile4_$r.json"
    "$TILE16_BIN" $K > "$OUT/tile16_$r.json"
  done
  "$TILE16_BIN" $K --llama-bench "$LLAMA" > "$OUT/tile16_llama.json"
  $NEW $K --llama-bench "$LLAMA" > "$OUT/tile4_llama.json"
fi
# Both halves of a group for 2-row tiles (WIDE_ROWS = 2, commit after a2764b9) against the build
# before (OLD_BIN: a build of b1dc97c, whose kernels a2764b9 keeps), interleaved: wide/.
if [[ -n "${OLD_BIN:-}" ]]; then
  mkdir -p "$OUT/wide"
  for r in 1 2; do
    "$OLD_BIN" $K > "$OUT/wide/wide_old_$r.json"
    $NEW $K > "$OUT/wide/wide_new_$r.json"
  done
  $NEW $K --llama-bench "$LLAMA" > "$OUT/wide/wide_llama.json"
  B="bench --threads 2 --datasets gsm8k,mt_bench,humaneval,math500 --num-prompts 10 --max-new-tokens 128 --methods pld,dart,auto --temperature 0 --seed 0"
  "$OLD_BIN" $B --out "$OUT/wide/bench_t0_old"
  $NEW $B --out "$OUT/wide/bench_t0_wide"
fi
# T = 1 with this tree's build (after the two-row change): bench_t1/.
$NEW bench --threads 2 --datasets gsm8k,mt_bench,humaneval,math500 --num-prompts 10 \
  --max-new-tokens 128 --methods pld,dart-sample,auto --temperature 1 --seed 0 --out "$OUT/bench_t1"
# suite/: the test suite's per-binary times before (b1dc97c^) and after (a2764b9), from
#   scripts/campaign.sh pause; time cargo test --release --locked --workspace; scripts/campaign.sh resume
# review/: decode A/B of the review commits (dec_wide/dec_final: 7d7aac1 vs 1f1ff20; rev_before/
# rev_after: 1f1ff20 vs a71fa08), each `bench-kernels --threads 2 --repeats 3 --json`, interleaved.
