#!/usr/bin/env bash
# docs/performance.md, "Verify rows at real context lengths" (found later the same day): the
# curve after 64 and 320 cached tokens measured in the steady state, two interleaved rounds, and
# the forwards right after a prefill by their place. Pauses the campaign.
set -euo pipefail
cd "$(dirname "$0")/../../../../.."
D=docs/results/performance/2026-11-25-xeon-amx/context_steady
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
cargo run --release --locked -q --example after_prefill -- 320
cargo run --release --locked -q --example after_prefill -- 64
for r in 1 2; do for c in 64 320; do
  target/release/paradraft bench-kernels --threads 2 --repeats 3 --context $c --prefill-tokens 128 \
    --decode-tokens 64 --json > "$D/ctx${c}_$r.json"
done; done
