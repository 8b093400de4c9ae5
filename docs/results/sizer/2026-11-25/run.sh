#!/usr/bin/env bash
# The sizer before and after 6a2a957 (verify cost learned from the rounds' clock; the speed
# guard switching drafting off only on evidence), interleaved: for each temperature, the old
# binary's bench then the new one's, on the four sets with pld, dart and auto at default
# (adaptive) settings. Pauses THE campaign while it runs.
#
#   run.sh OLD_BINARY NEW_BINARY      e.g. built from 10e79dc and 6a2a957
#   run.sh dart-sample                DART's tree against its sampled chain at T = 1 (this tree's
#                                     target/release/paradraft)
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=docs/results/sizer/2026-11-25
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
if [[ "$1" == dart-sample ]]; then
  target/release/paradraft bench --threads 2 --datasets gsm8k,mt_bench,humaneval,math500 \
    --num-prompts 10 --max-new-tokens 128 --methods dart,dart-sample --temperature 1 --seed 0 \
    --out "$OUT/t1_dart_vs_dart_sample"
  exit 0
fi
OLD=$1 NEW=$2
A="bench --threads 2 --datasets gsm8k,mt_bench,humaneval,math500 --num-prompts 10 --max-new-tokens 128 --methods pld,dart,auto"
for t in 0 1; do
  "$OLD" $A --temperature $t --seed 0 --out "$OUT/old_t$t"
  "$NEW" $A --temperature $t --seed 0 --out "$OUT/new_t$t"
done
