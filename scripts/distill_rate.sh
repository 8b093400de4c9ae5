#!/usr/bin/env bash
# Self-distillation rate: the old single-stream path (greedy generation with prompt-lookup
# speculation, 8 drafts, as `train dflash` did before continuous batching) against batched
# generation (`train dflash --until data --gen-seqs N`), on the same first N prompts of
# data/train/distill_prompts.jsonl.gz, 256 new tokens at most, model load excluded.
# Usage: scripts/distill_rate.sh N SEQS
set -euo pipefail
N=${1:-32} SEQS=${2:-32}
BIN=${BIN:-./target/release/paradraft}
tmp=$(mktemp -d)
python3 -c "import gzip,sys,itertools; sys.stdout.writelines(itertools.islice(gzip.open('data/train/distill_prompts.jsonl.gz','rt'), int(sys.argv[1])))" "$N" > "$tmp/prompts.jsonl"
# Single stream: one `generate` per prompt; tokens and times from its JSON stats.
python3 - "$BIN" "$tmp/prompts.jsonl" <<'PY'
import json, subprocess, sys
bin_, path = sys.argv[1], sys.argv[2]
toks = resp = ms = 0
for line in open(path):
    p = json.loads(line)["prompt"]
    out = subprocess.run([bin_, "generate", "--prompt", p, "--max-new-tokens", "256",
                          "--drafter", "pld", "--fixed-draft", "--num-speculative-tokens", "8",
                          "--json"], capture_output=True, text=True, check=True)
    v = json.loads(out.stdout)
    st = v["stats"]
    resp += st["generated_tokens"]; toks += st["generated_tokens"] + st["prompt_tokens"]
    ms += st["prefill_ms"] + st["decode_ms"]
print(f"single-stream PLD: {resp / ms * 1e3:.1f} response tokens/s ({toks / ms * 1e3:.1f} with prompts)")
PY
"$BIN" train dflash --out "$tmp/batched" --prompts "$tmp/prompts.jsonl" --samples "$N" \
  --gen-seqs "$SEQS" --until data 2>&1 | grep self-distilled
rm -rf "$tmp"
