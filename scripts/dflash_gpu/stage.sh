#!/usr/bin/env bash
# Stages the DFlash campaign's GPU run and the 16-core CPU measurements for a session lent a
# device (docs/dflash.md, "A lent GPU"). The device tool copies the working tree plus carried
# paths, 64 MiB in all per call, and the tracked tree alone is larger, so the run travels as
# scripts/dart_gpu/ + scripts/dflash_gpu/ (`scripts/dart_gpu/stage.sh hide`) + gpu_carry/cN/.
#
#   scripts/dflash_gpu/stage.sh carry   gpu_carry/c1: the CPU binary (stripped, gzip); c2: the
#                                       sampled answers (the campaign's sampled.bin, else the
#                                       committed ones, gzip), labelled by the target in training;
#                                       c3: the campaign's greedy samples (gzip) and the start
#                                       drafter; the GGUF split over c1-c3 to fill them; c4: what
#                                       `bench` reads (the DART drafter, data/bench, the default
#                                       n-gram trie, gzip) under a PARADRAFT_HOME layout
#   scripts/dart_gpu/stage.sh hide      then the calls below, then
#   scripts/dart_gpu/stage.sh restore
#
# The calls, back to back (the machine goes back after 30 s idle; files written outside $OUT
# stay while it is warm, carried files do not):
#   1. carry gpu_carry/c1:  bash scripts/dflash_gpu/device.sh stage
#   2. carry gpu_carry/c2:  bash scripts/dflash_gpu/device.sh stage
#   3. carry gpu_carry/c3:  bash scripts/dflash_gpu/device.sh train 7.5 --sampled-share 0.5
#   4. carry gpu_carry/c4:  bash scripts/dflash_gpu/device.sh bench
# A resumed training call carries c3 again (`train MIN --lr ...`: it resumes from the state the
# machine kept). The 2026-11-27 run (greedy answers only) used three calls: the GGUF in two parts.
# Then: cat drafter.st.* > model.safetensors beside the returned config.json, and evaluate it
# with the engine (`paradraft train campaign --method dflash --dir D --from DRAFTER
# --max-steps 1 --distill-share 0`: its step-0 point is the drafter as it came back).
set -euo pipefail
cd "$(dirname "$0")/../.."
CAMPAIGN="${PARADRAFT_CAMPAIGN_DIR:-$HOME/.cache/paradraft/campaign/dflash}"
MODEL="${PARADRAFT_MODEL:-$HOME/.cache/paradraft/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
DRAFTER="${PARADRAFT_DRAFTER:-drafters/smollm2-135m-dflash}"
BIN="${PARADRAFT_BIN:-target/release/paradraft}"
GIT="$(git rev-parse --git-dir)"
case "${1:-}" in
  carry)
    [[ -f "$MODEL" ]] || { echo "no model at $MODEL (set PARADRAFT_MODEL)" >&2; exit 1; }
    [[ -f "$CAMPAIGN/samples.bin" ]] || { echo "no $CAMPAIGN/samples.bin (start the DFlash campaign once)" >&2; exit 1; }
    [[ -x "$BIN" ]] || { echo "no $BIN (cargo build --release)" >&2; exit 1; }
    trie=$(ls -S "${PARADRAFT_HOME:-$HOME/.cache/paradraft}"/ngram/*.trie 2>/dev/null | head -n 1)
    [[ -n "$trie" ]] || { echo "no default n-gram trie yet (paradraft fetch-model --ngram)" >&2; exit 1; }
    grep -qx 'gpu_carry/' "$GIT/info/exclude" 2>/dev/null || echo 'gpu_carry/' >>"$GIT/info/exclude"
    rm -rf gpu_carry && mkdir -p gpu_carry/c1 gpu_carry/c2 gpu_carry/c3/drafter gpu_carry/c4/home/drafters gpu_carry/c4/home/data gpu_carry/c4/home/ngram
    strip -o gpu_carry/paradraft "$BIN" && gzip -9 -c gpu_carry/paradraft >gpu_carry/c1/paradraft.gz && rm gpu_carry/paradraft
    if [[ -f "$CAMPAIGN/sampled.bin" ]]; then
      gzip -9 -c "$CAMPAIGN/sampled.bin" >gpu_carry/c2/sampled.bin.gz
    else
      cp data/distill/smollm2-135m-sampled.bin.gz gpu_carry/c2/sampled.bin.gz
    fi
    gzip -9 -c "$CAMPAIGN/samples.bin" >gpu_carry/c3/samples.bin.gz
    cp "$DRAFTER/config.json" "$DRAFTER/model.safetensors" gpu_carry/c3/drafter/
    cp -r drafters/smollm2-135m-dart gpu_carry/c4/home/drafters/
    cp -r data/bench gpu_carry/c4/home/data/
    gzip -1 -c "$trie" >"gpu_carry/c4/home/ngram/$(basename "$trie").gz"
    # The GGUF fills calls 1-3 in order, each up to the limit.
    limit=$((64 * 1024 * 1024 - 512 * 1024)) # 64 MiB less room for the tracked scripts
    m=$(stat -c %s "$MODEL")
    off=0
    for i in 1 2 3; do
      used=$(du -cb "gpu_carry/c$i" | tail -n 1 | cut -f1)
      size=$((limit - used - 4096))
      ((i == 3 || off + size > m)) && size=$((m - off))
      ((size > 0)) && dd if="$MODEL" of="gpu_carry/c$i/model.part$i" bs=1M iflag=skip_bytes,count_bytes skip="$off" count="$size" status=none
      off=$((off + size))
    done
    cat gpu_carry/c*/model.part* | cmp - "$MODEL"
    for c in c1 c2 c3 c4; do
      w=$(du -cb "gpu_carry/$c" | tail -n 1 | cut -f1)
      echo "call ${c#c}: carry gpu_carry/$c ($w bytes, limit $limit)"
      ((w < limit)) || { echo "gpu_carry/$c is over the limit" >&2; exit 1; }
    done
    ;;
  *) echo "usage: $0 carry (hide/restore: scripts/dart_gpu/stage.sh)" >&2; exit 2 ;;
esac
