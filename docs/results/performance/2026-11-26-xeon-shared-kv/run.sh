#!/usr/bin/env bash
# Attention work units of up to 4 new tokens sharing the K/V tiles they all see (the build
# before and after): `bench-kernels` at 64 and 320 cached tokens, OLD and NEW release binaries
# interleaved in two rounds with the order swapped. ISA=avx2 forces the AVX2 kernels
# (PARADRAFT_ISA) and writes to avx2/. Pauses the training campaign.
#   OLD=/tmp/pd_old NEW=/tmp/pd_new [ISA=avx2] bash docs/results/performance/2026-11-26-xeon-shared-kv/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=docs/results/performance/2026-11-26-xeon-shared-kv${ISA:+/$ISA}
mkdir -p "$OUT"
[[ -n "${ISA:-}" ]] && export PARADRAFT_ISA=$ISA
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
for round in 1 2; do
  if [[ $round == 1 ]]; then order="old new"; else order="new old"; fi
  for ctx in 64 320; do
    for v in $order; do
      bin=$OLD; [[ $v == new ]] && bin=$NEW
      $bin bench-kernels --threads 2 --repeats 3 --context $ctx --json > "$OUT/${v}_c${ctx}_r$round.json"
    done
  done
done
