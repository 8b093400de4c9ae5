#!/usr/bin/env bash
# As run.sh, forced to the AVX2 kernels (PARADRAFT_ISA=avx2).
#   OLD=/tmp/pd_old NEW=/tmp/pd_new bash docs/results/performance/2026-11-26-xeon-parrows/run_avx2.sh
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=docs/results/performance/2026-11-26-xeon-parrows/avx2
mkdir -p "$OUT"
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
for round in 1 2; do
  if [[ $round == 1 ]]; then order="old new"; else order="new old"; fi
  for v in $order; do
    bin=$OLD; [[ $v == new ]] && bin=$NEW
    PARADRAFT_ISA=avx2 $bin bench-kernels --threads 2 --repeats 3 --json > "$OUT/${v}_r$round.json"
  done
done
