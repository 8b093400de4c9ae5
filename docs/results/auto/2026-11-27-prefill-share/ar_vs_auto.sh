#!/usr/bin/env bash
# AR against auto in serve, interleaved rounds (order alternating), one binary.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=${OUT:?}; BIN=${BIN:?}; ROUNDS=${ROUNDS:-4}; CONC=${CONC:-1,4,16}; REQ=${REQ:-48}; TEMP=${TEMP:-0}
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 )); then order="none auto"; else order="auto none"; fi
  for m in $order; do
    python3 scripts/bench_serve.py --bin "$BIN" --methods "$m" --concurrency "$CONC" --temperature "$TEMP" \
      --requests "$REQ" --max-tokens 128 --out "$OUT/${m}_r$r" > "$OUT/${m}_r$r.log" 2>&1
    grep -E "^\| $m " "$OUT/${m}_r$r/serve.md" | sed "s/^/r$r /"
  done
done
