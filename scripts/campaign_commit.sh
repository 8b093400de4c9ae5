#!/usr/bin/env bash
# Commit a campaign's progress (issue #23 item 4): draw its held-out curve into docs/ (SVG and
# PNG), export the answers it distilled into data/distill/, and when its best held-out alpha1
# beats the committed drafter's by at least 0.02, replace drafters/smollm2-135m-<method> with
# the campaign's best (f16) and its evaluation. The method is PARADRAFT_CAMPAIGN_METHOD (pard,
# the default as in scripts/campaign.sh, dflash or dart); a PARD or DFlash campaign's curve goes
# to docs/<method>_campaign.* and docs/results/<method>_campaign_curve.jsonl.
# Needs rsvg-convert (Debian: librsvg2-bin) for the PNG. The DART campaign restarted from the
# second GPU run's weights on 2026-11-25 (docs/dart_campaign.md): its curve goes to *_after_gpu2.*; the
# earlier phases' curves (docs/dart_campaign.*, *_after_gpu.*, the GPU runs' logs) stay as
# committed. A DART campaign's sampled answers (its sampled.bin, which starts as the committed
# ones) replace data/distill/smollm2-135m-sampled.bin.gz when it holds more of them.
set -euo pipefail
cd "$(dirname "$0")/.."
METHOD="${PARADRAFT_CAMPAIGN_METHOD:-pard}"
DIR="${PARADRAFT_CAMPAIGN_DIR:-$HOME/.cache/paradraft/campaign/$METHOD}"
BIN="${PARADRAFT_BIN:-target/release/paradraft}"
OUT="drafters/smollm2-135m-$METHOD"
if [[ "$METHOD" == dart ]]; then
  PLOT="${PARADRAFT_CURVE_PLOT:-docs/dart_campaign_after_gpu2.svg}"
  CURVE="${PARADRAFT_CURVE_OUT:-docs/results/dart_campaign_curve_after_gpu2.jsonl}"
else
  PLOT="${PARADRAFT_CURVE_PLOT:-docs/${METHOD}_campaign.svg}"
  CURVE="${PARADRAFT_CURVE_OUT:-docs/results/${METHOD}_campaign_curve.jsonl}"
fi
"$BIN" train campaign --method "$METHOD" --dir "$DIR" --plot "$PLOT"
rsvg-convert "$PLOT" -o "${PLOT%.svg}.png"
cp "$DIR/curve.jsonl" "$CURVE"
# The answers the campaign distilled (its samples.bin after the seed), so that a campaign on a new
# machine starts with them (`train campaign --more-samples`, this file by default).
python3 - "$DIR" data/distill/smollm2-135m-samples-more.bin.gz <<'PY'
import gzip, pathlib, sys
d, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
seed, have = (d / "seed.bin").read_bytes(), (d / "samples.bin").read_bytes()
if have[: len(seed)] != seed:
    sys.exit("samples.bin does not start with the seed: not exporting")
out.write_bytes(gzip.compress(seed[:8] + have[len(seed):], 9, mtime=0))
print(f"wrote {out}")
PY
if [[ -f "$DIR/sampled.bin" ]]; then
  python3 - "$DIR/sampled.bin" data/distill/smollm2-135m-sampled.bin.gz <<'PY'
import gzip, pathlib, struct, sys
src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
def count(raw):
    n, at = 0, 8
    while at + 12 <= len(raw):
        k = struct.unpack_from("<I", raw, at + 8)[0]
        if at + 12 + 4 * k > len(raw):
            break
        n, at = n + 1, at + 12 + 4 * k
    return n, at
raw = src.read_bytes()
if raw[:8] != b"PDTK0001":
    sys.exit(f"{src}: not a token file (no PDTK0001 header): not exporting")
have, end = count(raw)
old = count(gzip.decompress(out.read_bytes()))[0] if out.exists() else 0
if have > old:
    out.write_bytes(gzip.compress(raw[:end], 9, mtime=0))
    print(f"wrote {out}: {have} sampled answers (was {old})")
else:
    print(f"kept {out}: {old} sampled answers, the campaign has {have}")
PY
fi
python3 - "$DIR" "$OUT" <<'PY'
import json, shutil, sys, pathlib
d, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
best = json.loads((d / "best" / "eval.json").read_text())
have = json.loads((out / "eval.json").read_text())
# A DFlash drafter trained by `train dflash` keeps a list (at its block size, then at 8).
have = have[0] if isinstance(have, list) else have
a_best, a_have = best["eval"]["alpha"][0], have["alpha"][0]
# The committed drafter may have been evaluated on other prompts (DFlash's own split): the
# campaign's first evaluation of it, on the campaign's held-out set, is a baseline too.
first = json.loads((d / "curve.jsonl").read_text().splitlines()[0])
if first["step"] == 0:
    a_have = max(a_have, first["eval"]["alpha"][0])
print(f"campaign best alpha1 {a_best:.3f} at step {best['step']}; committed {a_have:.3f}")
if a_best < a_have + 0.02:
    print("not replacing the committed drafter (needs +0.02)")
    sys.exit(0)
for f in ["model.safetensors", "config.json"]:
    shutil.copy(d / "best" / f, out / f)
(out / "eval.json").write_text(json.dumps(best["eval"], indent=2) + "\n")
(out / "campaign.json").write_text(json.dumps({k: v for k, v in best.items() if k != "eval"}, indent=2) + "\n")
print(f"replaced {out} with the campaign's step {best['step']}")
PY
