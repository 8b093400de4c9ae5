#!/usr/bin/env bash
# PAR_ROWS 4 -> 16 (per-token work of forwards under 16 rows stays on the calling thread) on
# this machine: OLD and NEW release binaries, `bench-kernels` interleaved in two rounds with the
# order swapped. ISA=avx2 forces the AVX2 kernels (PARADRAFT_ISA) and writes to avx2/. Pauses
# the training campaign. OUT and CONTEXTS (e.g. "64 320": one run per cached-token count each
# round, files named ${v}_c${ctx}_r${round}.json) let later A/Bs reuse it.
#   OLD=/tmp/pd_old NEW=/tmp/pd_new [ISA=avx2] bash docs/results/performance/2026-11-26-xeon-parrows/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-docs/results/performance/2026-11-26-xeon-parrows}${ISA:+/$ISA}
mkdir -p "$OUT"
[[ -n "${ISA:-}" ]] && export PARADRAFT_ISA=$ISA
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
for round in 1 2; do
  if [[ $round == 1 ]]; then order="old new"; else order="new old"; fi
  for ctx in ${CONTEXTS:-default}; do
    for v in $order; do
      bin=$OLD; [[ $v == new ]] && bin=$NEW
      if [[ $ctx == default ]]; then
        $bin bench-kernels --threads 2 --repeats 3 --json > "$OUT/${v}_r$round.json"
      else
        $bin bench-kernels --threads 2 --repeats 3 --context "$ctx" --json > "$OUT/${v}_c${ctx}_r$round.json"
      fi
    done
  done
done
