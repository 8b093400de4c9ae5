#!/usr/bin/env bash
# docs/performance.md, Xeon section: every kernel path's curve measured the steady way
# (bench-kernels since bb9b032), two interleaved rounds, campaign paused; table.py of the parent
# folder prints them: python3 docs/results/performance/2026-11-25-xeon-amx/table.py $D
set -euo pipefail
cd "$(dirname "$0")/../../../../.."
D=docs/results/performance/2026-11-25-xeon-amx/paths_steady
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
for r in 1 2; do for p in avx512 avxvnni avx2; do
  PARADRAFT_ISA=$p target/release/paradraft bench-kernels --threads 2 --repeats 3 --json > "$D/${p}_$r.json"
done; done
