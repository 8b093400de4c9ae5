#!/usr/bin/env bash
# Interleaved A/B of two builds of the forward_loop example (e.g. two revisions built into
# different target directories): runs A and B alternately ROUNDS times with the same arguments
# and prints each one's median of per-run medians, its minimum, and B/A.
# Usage: scripts/ab_forward.sh BIN_A BIN_B "K ITERS CTX full|argmax" ROUNDS
# Example: git worktree add /tmp/a REV && (cd /tmp/a && cargo build --release --example forward_loop)
#          scripts/ab_forward.sh /tmp/a/target/release/examples/forward_loop \
#            target/release/examples/forward_loop "16 30 64 full" 8
set -euo pipefail
a=$1 b=$2 args=$3 rounds=${4:-8}
for _ in $(seq "$rounds"); do
  echo "A $("$a" $args)"
  echo "B $("$b" $args)"
done | python3 -c '
import re, statistics as st, sys
med, mn = {"A": [], "B": []}, {"A": [], "B": []}
for line in sys.stdin:
    lo, md = re.search(r"min ([0-9.]+) med ([0-9.]+)", line).groups()
    med[line[0]].append(float(md)); mn[line[0]].append(float(lo))
for k in "AB":
    print(f"{k}: median of medians {st.median(med[k]):.3f} ms, min {min(mn[k]):.3f} ms")
ratio = st.median(med["B"]) / st.median(med["A"])
print(f"B/A (medians) {ratio:.3f}")
'
