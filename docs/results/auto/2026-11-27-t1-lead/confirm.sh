#!/usr/bin/env bash
# The default-switch commit's build, once more at T = 0 and T = 1 (`pld,dart,auto`, seed 0,
# five sets × 10 prompts × 128 tokens), campaign paused:
#   OUT=DIR BIN=target/release/paradraft bash confirm.sh
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT="${OUT:?}"; BIN="${BIN:?}"
MODEL="${PARADRAFT_MODEL:-$HOME/.cache/paradraft/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
A="--model $MODEL --threads 2 --datasets copy,gsm8k,mt_bench,humaneval,math500 --num-prompts 10 --max-new-tokens 128 --methods pld,dart,auto"
for t in 0 1; do
  $BIN bench $A --temperature $t --seed 0 --out "$OUT/final_t$t"
done
