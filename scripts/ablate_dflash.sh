#!/usr/bin/env bash
# DFlash training ablations on one fixed small budget (docs/dflash.md, "Ablations"):
# cross-entropy vs cross-entropy + KL to the target's distribution, random vs target-layer
# initialisation. Each variant trains on the same first N self-distilled samples of SRC (a
# `train dflash` working directory with captured features) for STEPS steps and is evaluated on
# the same held-out tail (the last 5 % of those N samples, never trained on).
# Usage: scripts/ablate_dflash.sh SRC N STEPS OUT
set -euo pipefail
SRC=$1 N=$2 STEPS=$3 OUT=$4
BIN=${BIN:-./target/release/paradraft}
mkdir -p "$OUT/data"
# The first N samples and their feature rows (row width from the file name's tap count).
python3 - "$SRC" "$OUT/data" "$N" <<'PY'
import os, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
b = open(os.path.join(src, "samples.bin"), "rb").read()
at, k, toks = 8, 0, 0
while k < n:
    m = struct.unpack("<I", b[at + 8:at + 12])[0]
    at += 12 + 4 * m; k += 1; toks += m
open(os.path.join(dst, "samples.bin"), "wb").write(b[:at])
feat = [f for f in os.listdir(src) if f.startswith("features-")][0]
taps = len(feat[len("features-"):-len(".f16")].split("_"))
left = toks * taps * 576 * 2
with open(os.path.join(src, feat), "rb") as f, open(os.path.join(dst, feat), "wb") as g:
    while left:
        c = f.read(min(left, 1 << 26)); g.write(c); left -= len(c)
print(k, "samples,", toks, "tokens")
PY
run() {  # name, extra args
  local d="$OUT/$1"; shift
  mkdir -p "$d"; ln -sf "$(realpath "$OUT/data/samples.bin")" "$d/samples.bin"
  for f in "$OUT"/data/features-*; do ln -sf "$(realpath "$f")" "$d/"; done
  "$BIN" train dflash --out "$d" --samples "$N" --draft-layers 2 --anchors 64 --batch-seqs 2 \
    --max-steps "$STEPS" --epochs 1 "$@" 2>&1 | grep -v "^\s*$" | tail -4
}
run ce
run ce-kl --kl-weight 1
run ce-init --init-from-target
run ce-kl-init --kl-weight 1 --init-from-target
