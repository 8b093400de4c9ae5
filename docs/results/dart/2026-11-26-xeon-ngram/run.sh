#!/usr/bin/env bash
# DART with (old) and without (new: `--no-ngram`, the tree search on the drafter's
# distributions alone) its n-gram trie, one release binary BIN, by the sizer A/B's script:
# interleaved in two rounds with the order swapped, T = 1 and T = 0, the five sets × 10 prompts
# × 128 tokens, each run with its own AR baseline. Pauses the training campaign.
#   BIN=target/release/paradraft bash docs/results/dart/2026-11-26-xeon-ngram/run.sh
set -euo pipefail
cd "$(dirname "$0")"
OUT=$PWD OLD=$BIN NEW=$BIN NEW_FLAGS=--no-ngram METHODS=dart exec bash ../../sizer/2026-11-25-xeon/run.sh
