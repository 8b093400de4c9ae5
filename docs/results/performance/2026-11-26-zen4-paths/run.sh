#!/usr/bin/env bash
set -euo pipefail
# The kernel paths of docs/performance.md (2026-11-26, Zen 4): three interleaved rounds of
# bench-kernels per forced path. From the repository root: OUT=DIR bash docs/results/performance/2026-11-26-zen4-paths/run.sh
OUT="${OUT:?}"
cd "$(dirname "$0")/../../../.."
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
sleep 2
mkdir -p "$OUT"
K="bench-kernels --threads 2 --repeats 5 --json"
for r in 1 2 3; do
  for isa in avx512 avx2 avxvnni; do
    PARADRAFT_ISA=$isa ./target/release/paradraft $K > "$OUT"/${isa}_$r.json
  done
done
