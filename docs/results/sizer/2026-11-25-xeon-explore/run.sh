#!/usr/bin/env bash
# docs/auto.md, "The sizer on a truthful verify curve": that, and the first proposal after each backoff verifying its best node (kept). fixed8/: the steady-curve build with the round telemetry (before the gate and exploring changes, which fixed drafts do not use), every proposed node verified (--fixed-draft --num-speculative-tokens 8, T = 0, calib.py and prefix.py read it); oldcurve_logged/: auto and dart at T = 0 with the curve measured the old way and the round telemetry (replay.py reads it).
# OLD: the build of 7e51698; NEW: the build described. The same A/B as ../2026-11-25-xeon/run.sh
# (two rounds, order swapped, pld / dart / auto at T = 1 and T = 0, 10 prompts x 128 tokens per
# set, campaign paused), written here; compare.py and rounds.py of that folder read it.
#   OLD=/tmp/pd_old NEW=/tmp/pd_new bash docs/results/sizer/2026-11-25-xeon-explore/run.sh
set -euo pipefail
cd "$(dirname "$0")"
OUT="$PWD" bash ../2026-11-25-xeon/run.sh
