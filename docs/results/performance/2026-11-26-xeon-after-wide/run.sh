#!/usr/bin/env bash
# A one-row forward (300 cached tokens, last row's logits) right after a wider forward of PRE
# rows, or after idling GAP_US µs, on both kernel families; two rounds, interleaved; pauses the
# campaign. docs/performance.md, "A forward after a wider one, or after idling".
#   bash docs/results/performance/2026-11-26-xeon-after-wide/run.sh > …/out.txt
set -euo pipefail
cd "$(dirname "$0")/../../../.."
cargo build --release --example rows_loop -q
scripts/campaign.sh pause >&2 || true
trap 'scripts/campaign.sh resume >&2 || true' EXIT
for round in 1 2; do
  for isa in avx512 avx2; do
    for cfg in "0 0" "1 0" "4 0" "8 0" "16 0" "0 200" "0 1000" "0 5000"; do
      set -- $cfg
      echo -n "round $round, $isa, PRE=$1 GAP_US=$2: "
      PARADRAFT_ISA=$isa PRE=$1 GAP_US=$2 target/release/examples/rows_loop 1 300 last-full 300
    done
  done
done
