#!/usr/bin/env bash
# Where `auto` stands on a 2-vCPU Intel Xeon (AVX-512 VNNI, AVX-VNNI, AMX; kernels avx512),
# 2026-11-25, α1 0.750 DART weights: the cost curve, then pld / dart / auto at T = 0 (two runs)
# and T = 1 (one run), each with its own AR baseline, 10 prompts × 128 tokens per set.
# Pauses the training campaign while it runs.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=docs/results/auto/2026-11-25-xeon
cargo build --release --locked -q
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
target/release/paradraft bench-kernels --threads 2 --repeats 5 --json >"$OUT/kernels.json"
B="target/release/paradraft bench --threads 2 --datasets copy,gsm8k,mt_bench,humaneval,math500 --num-prompts 10 --max-new-tokens 128 --methods pld,dart,auto"
$B --out "$OUT/t0_r1"
$B --out "$OUT/t0_r2"
$B --temperature 1 --seed 0 --out "$OUT/t1"
