#!/usr/bin/env bash
# `auto`'s nodes priced by how the other sources stand on them, with a coarse key behind each
# fine one, and a lone session's model gate decided by the clock once timed (this folder's
# commit) against the build before (OLD), interleaved: `pld`, `dart`, `auto` at T = 0 and at
# T = 1 (seed 0), two rounds each, order swapped each round. Both binaries are built
# beforehand, e.g. OLD=/tmp/pd_old (git worktree of the commit before, cargo build --release)
# and NEW=target/release/paradraft. Pauses the campaign while it runs.
#   OUT=DIR OLD=BIN NEW=BIN bash run.sh
#   python3 docs/results/auto/2026-11-26-xeon-gate-evidence/rounds.py DIR new_t0_r1 old_t0_r1 ...
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT="${OUT:?}"; OLD="${OLD:?}"; NEW="${NEW:?}"
MODEL="${PARADRAFT_MODEL:-$HOME/.cache/paradraft/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
scripts/campaign.sh pause || true
trap 'scripts/campaign.sh resume || true' EXIT
A="--model $MODEL --threads 2 --datasets copy,gsm8k,mt_bench,humaneval,math500 --num-prompts 10 --max-new-tokens 128 --methods pld,dart,auto"
for r in 1 2; do
  if (( r % 2 )); then order="new old"; else order="old new"; fi
  for t in 0 1; do
    for w in $order; do
      bin=$NEW; [[ $w == old ]] && bin=$OLD
      $bin bench $A --temperature $t --seed 0 --out "$OUT/${w}_t${t}_r$r"
    done
  done
done
