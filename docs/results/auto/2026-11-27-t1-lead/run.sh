#!/usr/bin/env bash
# At T > 0 `auto`'s model leads: it runs in every round of a session alone, and a lookup's token
# beside the model's at the same parent is left out (this folder's commit, NEW) against the
# build before (OLD), interleaved: `pld`, `dart`, `auto` at T = 1 (seed 0), two rounds, order
# swapped each round. T = 0 runs the same code in both builds. Both binaries are built
# beforehand (OLD: a git worktree of the commit before, cargo build --release). Pauses the
# campaign while it runs.
#   OUT=DIR OLD=BIN NEW=BIN bash run.sh
#   python3 docs/results/auto/2026-11-26-xeon-gate-evidence/rounds.py DIR new_t1_r1 old_t1_r1 ...
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT="${OUT:?}"; OLD="${OLD:?}"; NEW="${NEW:?}"
MODEL="${PARADRAFT_MODEL:-$HOME/.cache/paradraft/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
A="--model $MODEL --threads 2 --datasets copy,gsm8k,mt_bench,humaneval,math500 --num-prompts 10 --max-new-tokens 128 --methods pld,dart,auto"
for r in 1 2; do
  if (( r % 2 )); then order="new old"; else order="old new"; fi
  for w in $order; do
    bin=$NEW; [[ $w == old ]] && bin=$OLD
    $bin bench $A --temperature 1 --seed 0 --out "$OUT/${w}_t1_r$r"
  done
done
