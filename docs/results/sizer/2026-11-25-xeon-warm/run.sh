#!/usr/bin/env bash
# docs/auto.md, "The sizer on a truthful verify curve": the verify curve measured after untimed one-row forwards, sizes interleaved (not kept alone).
# OLD: the build of 7e51698; NEW: the build described. The same A/B as ../2026-11-25-xeon/run.sh
# (two rounds, order swapped, pld / dart / auto at T = 1 and T = 0, 10 prompts x 128 tokens per
# set, campaign paused), written here; compare.py and rounds.py of that folder read it.
#   OLD=/tmp/pd_old NEW=/tmp/pd_new bash docs/results/sizer/2026-11-25-xeon-warm/run.sh
set -euo pipefail
cd "$(dirname "$0")"
OUT="$PWD" bash ../2026-11-25-xeon/run.sh
