#!/usr/bin/env bash
# DiffuSpec results for docs/diffuspec.md (SmolLM2-135M-Instruct, the committed DLM drafter,
# the README's 3-gram ARPA model). Every run measures AR alongside, interleaved, at T = 0.
#   ablation-{raw,cps}-{fixed,adl}: the paper's component ablation (CPS × ADL) on one drafter;
#   steps-S: refinement steps S = 1, 2, 4 (fixed block, CPS);
#   mode-{fast,faithful}: the two drafting modes (fixed block, CPS, S = 1);
#   sizing-{auto,adl}: the hardware-aware policy against ADL (CPS), for the default;
#   main: the default DiffuSpec next to PARD and prompt lookup on five sets.
# Usage: scripts/bench_diffuspec.sh OUT [N_PROMPTS]
set -euo pipefail
OUT=$1 N=${2:-3}
BIN=${BIN:-./target/release/paradraft}
ARPA=${ARPA:-data/ngram/smollm2-135m.arpa}
sets=(--max-new-tokens 128 --seed 1 --temperature 0)
four=(--datasets gsm8k,humaneval,math500,mt_bench)
mkdir -p "$OUT"
b() { # name, flags...
  local name=$1; shift
  "$BIN" bench --num-prompts "$N" "${sets[@]}" "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
}
b ablation-raw-fixed --methods diffuspec --no-cps --fixed-draft "${four[@]}"
b ablation-cps-fixed --methods diffuspec --ngram-arpa "$ARPA" --fixed-draft "${four[@]}"
b ablation-raw-adl --methods diffuspec --no-cps --draft-length adl "${four[@]}"
b ablation-cps-adl --methods diffuspec --ngram-arpa "$ARPA" --draft-length adl "${four[@]}"
for s in 2 4; do
  b steps-$s --methods diffuspec --ngram-arpa "$ARPA" --fixed-draft --dlm-steps $s "${four[@]}"
done
b mode-faithful --methods diffuspec --ngram-arpa "$ARPA" --fixed-draft --dlm-mode faithful "${four[@]}"
b sizing-auto --methods diffuspec --ngram-arpa "$ARPA" --draft-length auto "${four[@]}"
# The default DiffuSpec reads the ARPA model from its default path (the README's command).
b main --methods pld,pard,diffuspec --datasets gsm8k,humaneval,math500,mt_bench,alpaca
for d in ablation-raw-fixed ablation-cps-fixed ablation-raw-adl ablation-cps-adl steps-2 steps-4 \
  mode-faithful sizing-auto main; do
  echo "## $d"; cat "$OUT/$d/summary.md"; echo
done > "$OUT/summary.md"
