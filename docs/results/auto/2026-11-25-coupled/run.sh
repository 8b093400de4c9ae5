#!/usr/bin/env bash
# Coupled drafting (T > 0), the binary before (BASE, built from efeccc4) and after (NEW),
# interleaved. Run from the repository root with the campaign paused:
#   scripts/campaign.sh pause; BASE=... NEW=target/release/paradraft docs/results/auto/2026-11-25-coupled/run.sh OUT; scripts/campaign.sh resume
# 1. tau-{old,new}: τ with fixed 8-node DART trees at T = 1 (timing-free; run beside the
#    campaign, its speeds are not used).
# 2. {old,new}_r{1,2}: default (adaptive) sizing at T = 1, dart, dart-sample and auto, two
#    interleaved rounds, each with its own AR baseline.
# 3. src-tree, src-sample: auto at T = 1 with DART's tree (the default) or its sampled chain
#    as the model source (NEW only).
set -euo pipefail
OUT=${1:?output dir}
BASE=${BASE:?binary before}; NEW=${NEW:-target/release/paradraft}
mkdir -p "$OUT"
bench() { "$1" bench --threads 2 --temperature 1 --num-prompts 10 --max-new-tokens 128 "${@:3}" --out "$OUT/$2" > /dev/null 2> "$OUT/$2.log"; }
for b in new old; do
  bin=$NEW; [ $b = old ] && bin=$BASE
  bench "$bin" tau-$b --methods dart --fixed-draft --tree-budget 8
done
for r in 1 2; do
  bench "$BASE" old_r$r --methods dart,dart-sample,auto
  bench "$NEW" new_r$r --methods dart,dart-sample,auto
done
bench "$NEW" src-tree --methods dart-sample,auto
bench "$NEW" src-sample --methods auto --sources pld,suffix,trie,dart-sample
