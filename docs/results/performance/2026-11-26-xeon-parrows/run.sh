#!/usr/bin/env bash
# PAR_ROWS 4 -> 16 (per-token work of forwards under 16 rows stays on the calling thread) on
# this machine: OLD and NEW release binaries, `bench-kernels` interleaved in two rounds with the
# order swapped. ISA=avx2 forces the AVX2 kernels (PARADRAFT_ISA) and writes to avx2/. Pauses
# the training campaign.
#   OLD=/tmp/pd_old NEW=/tmp/pd_new [ISA=avx2] bash docs/results/performance/2026-11-26-xeon-parrows/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=docs/results/performance/2026-11-26-xeon-parrows${ISA:+/$ISA}
mkdir -p "$OUT"
[[ -n "${ISA:-}" ]] && export PARADRAFT_ISA=$ISA
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
for round in 1 2; do
  if [[ $round == 1 ]]; then order="old new"; else order="new old"; fi
  for v in $order; do
    bin=$OLD; [[ $v == new ]] && bin=$NEW
    $bin bench-kernels --threads 2 --repeats 3 --json > "$OUT/${v}_r$round.json"
  done
done
