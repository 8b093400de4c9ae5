#!/usr/bin/env bash
# COD's claim (PARD §3.2) at equal compute: the same drafter (the target's first 4 layers),
# data, seed and schedule shape, trained once with conditional drop-token (r 0.7, r_min 0.2:
# 3.37 S slots per S-token sequence) and once with every copy whole (r = r_min = 1: 8 S slots),
# each for about the same wall-clock budget; then the held-out loss curve and α_k of each.
# Usage: scripts/cod_ablation.sh OUT [COD_STEPS] [ALL_STEPS]
set -euo pipefail
OUT=$1 A=${2:-78} B=${3:-33}
BIN=${BIN:-./target/release/paradraft}
for run in "cod 0.7 0.2 $A" "all 1.0 1.0 $B"; do
  set -- $run
  mkdir -p "$OUT/$1"
  [ -f "$OUT/$1/samples.bin" ] || zcat data/distill/smollm2-135m-samples.bin.gz > "$OUT/$1/samples.bin"
  "$BIN" train pard --out "$OUT/$1" --samples 5131 --draft-layers 4 --k 8 --max-seq 384 \
    --lr 4e-4 --batch-seqs 4 --cod-r "$2" --cod-r-min "$3" --max-steps "$4" --save-every 1000 \
    > "$OUT/$1.log" 2>&1
done
for r in cod all; do
  echo "## $r"
  tail -n 1 "$OUT/$r/pard/train_log.jsonl"
  cat "$OUT/$r/pard/eval.json"
done > "$OUT/summary.txt"
