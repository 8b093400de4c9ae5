#!/usr/bin/env bash
# The model gate's batch pricing (#25): `auto` served at 4 and 16 streams by the binary before
# the change (OLD) and after it (NEW), interleaved, beside AR, ROUNDS (3) rounds. Run from the
# repository root with the campaign paused:
#   scripts/campaign.sh pause; OLD=… NEW=… docs/results/auto/2026-11-24-batch-gate/run.sh OUT; scripts/campaign.sh resume
set -euo pipefail
ROUNDS=${ROUNDS:-3} exec scripts/ab_rounds.sh "${1:?output dir}" \
  'python3 scripts/bench_serve.py --bin "$BIN" --methods none,auto --concurrency 4,16 --requests 48 --max-tokens 128 --out "$OUT/$RUN"'
