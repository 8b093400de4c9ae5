#!/usr/bin/env bash
# Two DFlash training runs side by side on the same self-distilled data (SRC: a `train dflash`
# working directory with samples.bin and captured features), differing only in the loss:
# cross-entropy alone, and cross-entropy + KL to the target's distribution. Each run writes its
# log, loss curve, checkpoint, exported drafter and held-out evaluation to OUT/<name>.
# Usage: scripts/train_pair.sh SRC OUT STEPS
set -euo pipefail
SRC=$1 OUT=$2 STEPS=$3
BIN=${BIN:-./target/release/paradraft}
N=$(python3 -c "
import struct,sys
b=open('$SRC/samples.bin','rb').read(); at=8; n=0
while at+12<=len(b):
    k=struct.unpack('<I',b[at+8:at+12])[0]
    if at+12+4*k>len(b): break
    at+=12+4*k; n+=1
print(n)")
run() {  # name, extra args
  local d="$OUT/$1"; shift
  mkdir -p "$d"; ln -sf "$(realpath "$SRC/samples.bin")" "$d/samples.bin"
  for f in "$SRC"/features-*; do ln -sf "$(realpath "$f")" "$d/"; done
  "$BIN" train dflash --out "$d" --samples "$N" --draft-layers 2 --anchors 64 --batch-seqs 4 \
    --epochs 100 --max-steps "$STEPS" "$@" > "$d/stdout.log" 2>&1
}
run ce &
run ce-kl --kl-weight 1 &
wait
