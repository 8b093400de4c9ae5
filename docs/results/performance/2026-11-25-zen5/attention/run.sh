#!/bin/bash
# Causal attention units take their slots as one range (and V rows are read once per group of
# heads): OLD (a build of e5f1c51) against NEW, interleaved, Zen 5, campaign paused.
#   OLD=path/to/old/paradraft bash docs/results/performance/2026-11-25-zen5/attention/run.sh [OUT]
# c_*: both changes against OLD; vsum_*: the V change alone (an intermediate build) against OLD.
set -euo pipefail
cd "$(dirname "$0")/../../../../.."
OUT="${1:-runs/attention}"
NEW=${NEW:-./target/release/paradraft}
mkdir -p "$OUT"
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
sleep 1
for r in 1 2; do for isa in avx512 avx2; do for b in old new; do
  bin=$OLD; [ $b = new ] && bin=$NEW
  PARADRAFT_ISA=$isa $bin bench-kernels --threads 2 --repeats 5 --json > "$OUT/c_${isa}_${b}_$r.json"
done; done; done
for r in 1 2; do for b in old new; do
  bin=$OLD; [ $b = new ] && bin=$NEW
  $bin train campaign --bench 12 --dir /tmp/camp 2>&1 | tail -n 1 | sed "s/^/$b $r: /"
done; done | tee "$OUT/train_bench.txt"
# After, beside llama.cpp (LLAMA: llama-bench as in ../run.sh): after_llama.json.
if [[ -n "${LLAMA:-}" ]]; then
  $NEW bench-kernels --threads 2 --repeats 5 --json --llama-bench "$LLAMA" > "$OUT/after_llama.json"
fi
