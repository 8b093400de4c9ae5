#!/usr/bin/env bash
# bench-kernels against llama-bench on GGUF files of several types (same files, interleaved by
# bench-kernels itself), one JSON per file plus a table, for docs/performance.md.
#
#   scripts/quant/bench_types.sh OUT_DIR LLAMA_BENCH FILE.gguf...
# Pause background jobs first (scripts/campaign.sh pause): timings beside them are not figures.
set -euo pipefail
out="$1"; lb="$2"; shift 2
mkdir -p "$out"
bin="$(dirname "$0")/../../target/release/paradraft"
for f in "$@"; do
  name="$(basename "$f" .gguf)"
  "$bin" bench-kernels --model "$f" --llama-bench "$lb" --repeats 3 --threads 2 --json >"$out/$name.json"
  python3 - "$out/$name.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
r = j.get("ratios", {})
print(sys.argv[1].split("/")[-1], json.dumps(r))
PY
done
