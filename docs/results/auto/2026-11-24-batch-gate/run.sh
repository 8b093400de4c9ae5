#!/usr/bin/env bash
# The model gate's batch pricing (#25): `auto` served at 4 and 16 streams by the binary before
# the change (OLD) and after it (NEW), interleaved, beside AR, ROUNDS rounds. Run from the
# repository root with the campaign paused:
#   scripts/campaign.sh pause; OLD=… NEW=… docs/results/auto/2026-11-24-batch-gate/run.sh OUT; scripts/campaign.sh resume
set -euo pipefail
OUT=${1:?output dir}
OLD=${OLD:?binary before}
NEW=${NEW:?binary after}
mkdir -p "$OUT"
for r in $(seq "${ROUNDS:-3}"); do
  for v in old new; do
    b=OLD; [[ $v == new ]] && b=NEW
    python3 scripts/bench_serve.py --bin "${!b}" --methods none,auto --concurrency 4,16 \
      --requests 48 --max-tokens 128 --out "$OUT/$v-r$r" > "$OUT/$v-r$r.log" 2>&1
  done
done
