#!/usr/bin/env bash
# Preemption A/B (#64): 32 streams, 64 chat requests with max_tokens 512, a 192 MiB KV pool
# (534 pages of 16 slots: ~8.5K tokens of SmolLM2-135M's f16 K/V) at --ctx-size 2048.
# OLD: a build without preemption (admission sets aside each request's whole run); NEW: this
# commit at the default conservativeness (1) and at 0 (admission for a prompt and a round).
# Usage: OLD=/path/to/old/paradraft NEW=target/release/paradraft OUT=/tmp/pre bash run.sh
set -euo pipefail
cd "$(dirname "$0")/../../../.."
for round in 1 2; do
  for v in old new new0; do
    bin=$NEW; extra=""
    [ "$v" = old ] && bin=$OLD
    [ "$v" = new0 ] && extra="--schedule-conservativeness 0"
    python3 scripts/bench_serve.py --bin "$bin" --methods none --concurrency 32 --requests 64 \
      --max-tokens 512 --server-args "--kv-memory-mib 192 --ctx-size 2048 $extra" \
      --out "$OUT/$v$round" | grep "c=32"
  done
done
