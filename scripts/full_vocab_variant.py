#!/usr/bin/env python3
"""Copies a DFlash drafter directory without its reduced vocabulary (drops `d2t` and
`draft_vocab_size`), so the same network scores the target's full vocabulary. Used to measure
what the reduced vocabulary saves per round (docs/dflash.md).
Usage: scripts/full_vocab_variant.py SRC_DIR DST_DIR"""
import json, os, struct, sys

src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
cfg = json.load(open(os.path.join(src, "config.json")))
cfg.pop("draft_vocab_size", None)
json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
raw = open(os.path.join(src, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
out_header, chunks, off = {}, [], 0
for name, info in header.items():
    if name == "__metadata__" or name == "d2t":
        continue
    s, e = info["data_offsets"]
    chunks.append(data[s:e])
    out_header[name] = dict(info, data_offsets=[off, off + (e - s)])
    off += e - s
hb = json.dumps(out_header).encode()
hb += b" " * (-len(hb) % 8)
with open(os.path.join(dst, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(hb)) + hb + b"".join(chunks))
