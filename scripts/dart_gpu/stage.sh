#!/usr/bin/env bash
# Stages THE DART campaign's GPU run for a developers' session lent a GPU (docs/dart_campaign.md, "A lent
# GPU"). The device tool copies the working tree plus carried paths, 64 MiB in all, and the
# tracked tree alone is larger, so the run travels as: this folder (untracked) + gpu_carry/.
#
#   scripts/dart_gpu/stage.sh carry     gpu_carry/: the sampled answers so far (gzip; the
#                                       campaign's sampled.bin, else the committed
#                                       data/distill/smollm2-135m-sampled.bin.gz), the GGUF in
#                                       parts, the campaign's greedy samples and the drafter,
#                                       and the list of N calls that carry them (N = 3 since the
#                                       answers passed 9.3 MB; each call ≤ 64 MiB)
#   scripts/dart_gpu/stage.sh hide      takes every tracked file off the index (backed up) and
#                                       ignores all but scripts/dart_gpu/ and scripts/dflash_gpu/
#                                       (which imports dart_gpu/target.py), so only they travel
#   scripts/dart_gpu/stage.sh restore   puts the index and the ignore list back (run it as soon as
#                                       the GPU calls are done; nothing in the work tree changes)
#
# The calls (each ≤ 10 minutes; the machine goes back after 30 s idle, so make them back to back;
# the 2026-11-26 run, docs/dart_campaign.md, used these with 801 s of device time, N = 2 then):
#   1. mkdir -p /tmp/pd && cp gpu_carry/model.part1 /tmp/pd/ &&
#      gunzip -c gpu_carry/sampled.bin.gz > /tmp/pd/sampled.bin
#   2. … N−1. cp gpu_carry/model.partI /tmp/pd/
#   N. cat /tmp/pd/model.part* gpu_carry/model.partN > /tmp/pd/m.gguf && python3
#      scripts/dart_gpu/train.py --model /tmp/pd/m.gguf --samples gpu_carry/samples.bin.gz
#      --drafter gpu_carry/drafter --out /tmp/pd/run --state /tmp/pd/state.pt
#      --sampled /tmp/pd/sampled.bin --generate 16384 --gen-batch 1024 --gen-minutes 2.5
#      --sampled-share 0.6 --minutes 9.3 > $OUT/log.txt 2>&1;
#      split -b 15M /tmp/pd/run/drafter/model.safetensors $OUT/drafter.st.;
#      cp /tmp/pd/run/log.jsonl /tmp/pd/run/drafter/config.json $OUT/;
#      gzip -c /tmp/pd/sampled.bin | split -b 15M - $OUT/sampled.gz.
#      (generation: about 30 answers a second on an H100 in batches of 512, 41 on an H200 in
#      batches of 1,024)
#   N+1. the same train.py command without --generate and a shorter --minutes (it resumes from
#      /tmp/pd/state.pt and reuses /tmp/pd/m.gguf while the machine is warm), carrying
#      gpu_carry/samples.bin.gz and gpu_carry/drafter again: carried files do not stay between
#      calls, only what a call wrote outside the work tree does.
# Then: cat drafter.st.* > model.safetensors, and evaluate it with the engine
# (`paradraft train campaign --dir D --from DRAFTER --max-steps 1 --distill-share 0`, its first
# curve point); the answers in sampled.gz.* (after the campaign's, whose file was carried)
# replace data/distill/smollm2-135m-sampled.bin.gz.
set -euo pipefail
cd "$(dirname "$0")/../.."
CAMPAIGN="${PARADRAFT_CAMPAIGN_DIR:-$HOME/.cache/paradraft/campaign/dart}"
MODEL="${PARADRAFT_MODEL:-$HOME/.cache/paradraft/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
# The drafter the run starts from (e.g. one grown by a layer: `paradraft train dart --grow`).
DRAFTER="${PARADRAFT_DRAFTER:-drafters/smollm2-135m-dart}"
GIT="$(git rev-parse --git-dir)"
BACKUP="$GIT/dart_gpu_backup"
case "${1:-}" in
  carry)
    [[ -f "$MODEL" ]] || { echo "no model at $MODEL (set PARADRAFT_MODEL)" >&2; exit 1; }
    [[ -f "$CAMPAIGN/samples.bin" ]] || { echo "no $CAMPAIGN/samples.bin (make it: paradraft train campaign --max-steps 1 --distill-share 0)" >&2; exit 1; }
    mkdir -p "$GIT/info" gpu_carry/drafter
    grep -qx 'gpu_carry/' "$GIT/info/exclude" 2>/dev/null || echo 'gpu_carry/' >>"$GIT/info/exclude"
    gzip -9 -c "$CAMPAIGN/samples.bin" >gpu_carry/samples.bin.gz
    if [[ -f "$CAMPAIGN/sampled.bin" ]]; then
      gzip -9 -c "$CAMPAIGN/sampled.bin" >gpu_carry/sampled.bin.gz
    else
      cp data/distill/smollm2-135m-sampled.bin.gz gpu_carry/sampled.bin.gz
    fi
    cp "$DRAFTER/config.json" "$DRAFTER/model.safetensors" gpu_carry/drafter/
    # The calls carry, in this order, the sampled answers, the GGUF in parts, the greedy samples
    # and the drafter; the GGUF is split so that every call weighs the same, in as few calls as
    # the limit allows (two until the sampled answers passed 9.3 MB, three since).
    limit=$((64 * 1024 * 1024 - 512 * 1024)) # 64 MiB less room for the tracked scripts
    m=$(stat -c %s "$MODEL")
    s1=$(stat -c %s gpu_carry/sampled.bin.gz)
    s2=$(du -cb gpu_carry/samples.bin.gz gpu_carry/drafter/* | tail -n 1 | cut -f1)
    total=$((m + s1 + s2))
    calls=$(((total + limit - 1) / limit))
    per=$(((total + calls - 1) / calls))
    ((s1 < per && s2 < per)) || { echo "the sampled answers or the drafter alone fill a call" >&2; exit 1; }
    rm -f gpu_carry/model.part*
    off=0
    for i in $(seq "$calls"); do
      size=$per
      ((i == 1)) && size=$((per - s1))
      ((i == calls)) && size=$((m - off))
      dd if="$MODEL" of="gpu_carry/model.part$i" bs=1M iflag=skip_bytes,count_bytes skip="$off" count="$size" status=none
      off=$((off + size))
      extra=""
      ((i == 1)) && extra=" gpu_carry/sampled.bin.gz"
      ((i == calls)) && extra=" gpu_carry/samples.bin.gz gpu_carry/drafter"
      weight=$(du -cb "gpu_carry/model.part$i" $extra | tail -n 1 | cut -f1)
      echo "call $i of $calls: carry gpu_carry/model.part$i$extra ($weight bytes, limit $limit)"
    done
    cat gpu_carry/model.part* | cmp - "$MODEL"
    ls -l gpu_carry
    ;;
  hide)
    [[ -e "$BACKUP" ]] && { echo "already hidden: run '$0 restore' first" >&2; exit 1; }
    mkdir -p "$BACKUP" "$GIT/info"
    cp "$GIT/index" "$BACKUP/index"
    touch "$GIT/info/exclude"
    cp "$GIT/info/exclude" "$BACKUP/exclude"
    git rm -r --cached -q .
    printf '/*\n!/scripts/\n/scripts/*\n!/scripts/dart_gpu/\n!/scripts/dflash_gpu/\n' >>"$GIT/info/exclude"
    git status --short -uall | grep -v '^D ' || true
    ;;
  restore)
    [[ -e "$BACKUP" ]] || { echo "nothing to restore" >&2; exit 1; }
    cp "$BACKUP/index" "$GIT/index"
    cp "$BACKUP/exclude" "$GIT/info/exclude"
    rm -rf "$BACKUP"
    git status --short
    ;;
  *) echo "usage: $0 carry|hide|restore" >&2; exit 2 ;;
esac
