#!/usr/bin/env bash
# Prefill/decode speed of paradraft's AR path next to llama.cpp's llama-bench on the same model,
# interleaved (REPEATS rounds of: llama-bench, paradraft), 2 threads.
#   scripts/compare_llama_cpp.sh PATH/llama-bench [MODEL] [REPEATS]
set -euo pipefail
LB=${1:?path to llama-bench}
BIN=${PARADRAFT_BIN:-target/release/paradraft}
MODEL=${2:-$($BIN fetch-model)}
REPEATS=${3:-5}
PROMPT="Write a Python function that takes a list of integers and returns the length of the longest strictly increasing subsequence. Explain the dynamic programming recurrence, give the time and memory complexity, and then show how to improve it to O(n log n) with patience sorting. Finally, test it on [10, 9, 2, 5, 3, 7, 101, 18] and on an empty list, and describe what the function returns in each case and why."
for i in $(seq "$REPEATS"); do
  "$LB" -m "$MODEL" -t 2 -p 1,4,16,128 -n 128 -r 1 -o jsonl 2>/dev/null |
    python3 -c 'import sys,json
for l in sys.stdin:
    r=json.loads(l); print("llama.cpp", "pp%d"%r["n_prompt"] if r["n_prompt"] else "tg%d"%r["n_gen"], round(r["avg_ts"],1))'
  "$BIN" generate --model "$MODEL" --threads 2 --drafter none --prompt "$PROMPT" --max-new-tokens 128 --json |
    python3 -c 'import sys,json
s=json.load(sys.stdin)["stats"]; print("paradraft prefill(%d tok)"%s["prompt_tokens"], round(s["prefill_tok_s"],1)); print("paradraft decode(%d tok)"%s["generated_tokens"], round(s["decode_tok_s"],1))'
done
