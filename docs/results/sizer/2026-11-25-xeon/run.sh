#!/usr/bin/env bash
# The sizer's changes of 2026-11-25 on a 2-vCPU Intel Xeon (docs/auto.md, "The sizer on an
# Intel Xeon"): OLD and NEW release binaries (the build before and after), interleaved in two
# rounds with the order swapped, pld / dart / auto at T = 1 and T = 0, 10 prompts × 128 tokens
# per set, each run with its own AR baseline. Pauses the training campaign.
# The top-level runs: the guard counting asked rounds and the backoff after empty cuts (kept).
# Subfolders, the same script with earlier builds against the same OLD: shared_only/ (one
# learned verify cost per process, one round, r2 lost to a build running beside it),
# shared_asked/ (that and the guard), shared_cost/ (all three): not kept (docs/auto.md).
# Later A/Bs reuse it: OUT, METHODS (default pld,dart,auto), and OLD_FLAGS / NEW_FLAGS (extra
# bench flags of each side, e.g. one binary with and without an option).
#   OLD=/tmp/pd_old NEW=/tmp/pd_new bash docs/results/sizer/2026-11-25-xeon/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-docs/results/sizer/2026-11-25-xeon}
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
A="bench --threads 2 --datasets copy,gsm8k,mt_bench,humaneval,math500 --num-prompts 10 --max-new-tokens 128 --methods ${METHODS:-pld,dart,auto}"
for round in 1 2; do
  if [[ $round == 1 ]]; then order="old new"; else order="new old"; fi
  for t in 1 0; do
    for v in $order; do
      bin=$OLD flags=${OLD_FLAGS:-}
      [[ $v == new ]] && bin=$NEW flags=${NEW_FLAGS:-}
      # shellcheck disable=SC2086 # flags are words
      $bin $A $flags --temperature $t --seed 0 --out "$OUT/t${t}_${v}_r$round" > /dev/null 2>&1
    done
  done
done
