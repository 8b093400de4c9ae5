#!/usr/bin/env bash
# Behaviour unchanged by the #24 refactor (2026-11-24): the previous commit's binary (OLD) and
# this one (NEW), interleaved, on the same prompts. Fixed drafts: τ must be identical (the
# drafting and selection code paths); adaptive drafts: speedups within run-to-run noise.
# Usage: OLD=path/to/old/paradraft NEW=target/release/paradraft docs/results/architecture/2026-11-24/run.sh OUTDIR
# (pause any background job first: scripts/campaign.sh pause)
set -euo pipefail
out=${1:?out dir}
for v in old new; do
  b=$([ $v = old ] && echo "$OLD" || echo "$NEW")
  "$b" bench --threads 2 --fixed-draft --methods pld,dart,dflash-tree,pard,diffuspec \
    --datasets gsm8k,mt_bench --num-prompts 4 --max-new-tokens 64 --data-dir data/bench --out "$out/fx$v"
done
for round in 1 2 3; do for v in old new; do
  b=$([ $v = old ] && echo "$OLD" || echo "$NEW")
  "$b" bench --threads 2 --methods pld,dart --datasets gsm8k,mt_bench --num-prompts 10 \
    --max-new-tokens 128 --data-dir data/bench --out "$out/L$v$round"
done; done
