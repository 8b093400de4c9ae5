#!/usr/bin/env bash
# Interleaved serve A/B: AR (OLD binary), auto with OLD, auto with NEW; three rounds, order rotated.
# TRACE=1: binaries built with step_trace.patch write each run's steps to OUT/<arm>_r<round>.trace.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=${OUT:?}; OLD=${OLD:?}; NEW=${NEW:?}; ROUNDS=${ROUNDS:-3}; CONC=${CONC:-4,16}; REQ=${REQ:-48}
mkdir -p "$OUT"
arms=("none $OLD ar" "auto $OLD old" "auto $NEW new")
for r in $(seq 1 "$ROUNDS"); do
  for i in 0 1 2; do
    a=(${arms[$(( (i + r) % 3 ))]})
    if [[ "${TRACE:-0}" == 1 ]]; then export PD_TRACE="$OUT/${a[2]}_r$r.trace"; fi
    python3 scripts/bench_serve.py --bin "${a[1]}" --methods "${a[0]}" --concurrency "$CONC" \
      --requests "$REQ" --max-tokens 128 --out "$OUT/${a[2]}_r$r" > "$OUT/${a[2]}_r$r.log" 2>&1
    grep -E "^\| ${a[0]} " "$OUT/${a[2]}_r$r/serve.md" | sed "s/^/${a[2]} r$r /"
  done
done
