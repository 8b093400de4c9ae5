#!/usr/bin/env bash
# Context-aware verify costs (an experiment, not kept; docs/dart.md "Tree size from the
# machine"): long generations (512 new tokens, so most rounds run after 200-700 cached tokens)
# by the binary without it (OLD: c(k) timed after 64 tokens only) and with it (NEW),
# interleaved, ROUNDS rounds, each bench with its own AR baseline. all-rows/: every draft
# priced at its context; trees-only/: chains at the base context. long-prompts/: the same
# comparison (trees-only) on six ~1,200-token summarisation prompts made from docs/*.md
# (prompts.jsonl; bench --data-dir DIR where DIR/mt_bench.jsonl is that file, 6 prompts,
# 256 new tokens, methods pld,dart,auto).
# Run from the repository root with the campaign paused:
#   scripts/campaign.sh pause; OLD=… NEW=… docs/results/sizing/2026-11-24-context/run.sh OUT; scripts/campaign.sh resume
set -euo pipefail
exec scripts/ab_rounds.sh "${1:?output dir}" \
  '"$BIN" bench --threads 2 --methods pld,dart,auto --datasets mt_bench,copy --num-prompts 5 --max-new-tokens 512 --out "$OUT/$RUN"'
# The c(k) tables beside it (bench-kernels-context*.txt) came from, campaign paused, for
# r in 1 2 and c in 64 512 1024:
#   target/release/paradraft bench-kernels --threads 2 --repeats 3 --context $c --decode-tokens 16 --prefill-tokens 64
