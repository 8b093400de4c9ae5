#!/usr/bin/env bash
# Stages THE DART campaign's GPU run for a developers' session lent a GPU (docs/dart.md, "A lent
# GPU"). The device tool copies the working tree plus carried paths, 64 MiB in all, and the
# tracked tree alone is larger, so the run travels as: this folder (untracked) + gpu_carry/.
#
#   scripts/dart_gpu/stage.sh carry     gpu_carry/: the GGUF in two parts (split so the two calls
#                                       below weigh the same, ≈ 65 MB each), the
#                                       campaign's greedy samples and the sampled answers so far
#                                       (gzip; the campaign's sampled.bin, else the committed
#                                       data/distill/smollm2-135m-sampled.bin.gz), the drafter
#   scripts/dart_gpu/stage.sh hide      takes every tracked file off the index (backed up) and
#                                       ignores all but scripts/dart_gpu/, so only it travels
#   scripts/dart_gpu/stage.sh restore   puts the index and the ignore list back (run it as soon as
#                                       the GPU calls are done; nothing in the work tree changes)
#
# The calls (each ≤ 10 minutes; the machine goes back after 30 s idle, so make them back to back;
# the 2026-11-25 run, docs/dart.md, used these with 1,531 s of the 1,800 s of device time):
#   1. carry gpu_carry/model.part1, gpu_carry/sampled.bin.gz:  mkdir -p /tmp/pd && cp
#      gpu_carry/model.part1 /tmp/pd/ && gunzip -c gpu_carry/sampled.bin.gz > /tmp/pd/sampled.bin
#   2. carry gpu_carry/model.part2, gpu_carry/samples.bin.gz, gpu_carry/drafter:
#      cat /tmp/pd/model.part1 gpu_carry/model.part2 > /tmp/pd/m.gguf && python3
#      scripts/dart_gpu/train.py --model /tmp/pd/m.gguf --samples gpu_carry/samples.bin.gz
#      --drafter gpu_carry/drafter --out /tmp/pd/run --state /tmp/pd/state.pt
#      --sampled /tmp/pd/sampled.bin --generate 8192 --gen-batch 512 --gen-minutes 4.5
#      --sampled-share 0.6 --minutes 9.0 > $OUT/log.txt 2>&1;
#      split -b 15M /tmp/pd/run/drafter/model.safetensors $OUT/drafter.st.;
#      cp /tmp/pd/run/log.jsonl /tmp/pd/run/drafter/config.json $OUT/;
#      gzip -c /tmp/pd/sampled.bin > $OUT/sampled.bin.gz
#      (generation ran at about 30 answers a second on an H100: 8,704 in 282 s)
#   3. (4.) the same command without model.part2 (it resumes from /tmp/pd/state.pt and reuses
#      /tmp/pd/m.gguf while the machine is warm); a shorter --generate, or none.
# Then: cat drafter.st.* > model.safetensors, and evaluate it with the engine
# (`paradraft train campaign --dir D --from DRAFTER --max-steps 1 --distill-share 0`, its first
# curve point); the answers in sampled.bin.gz replace data/distill/smollm2-135m-sampled.bin.gz.
set -euo pipefail
cd "$(dirname "$0")/../.."
CAMPAIGN="${PARADRAFT_CAMPAIGN_DIR:-$HOME/.cache/paradraft/campaign/dart}"
MODEL="${PARADRAFT_MODEL:-$HOME/.cache/paradraft/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
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
    cp drafters/smollm2-135m-dart/config.json drafters/smollm2-135m-dart/model.safetensors gpu_carry/drafter/
    # The GGUF is split where both calls weigh the same: call 1 carries part 1 and the sampled
    # answers, call 2 part 2, the greedy samples and the drafter (a fixed 60 MB part 1 went
    # over the limit once the sampled answers passed 7.1 MB).
    m=$(stat -c %s "$MODEL")
    s1=$(stat -c %s gpu_carry/sampled.bin.gz)
    s2=$(du -cb gpu_carry/samples.bin.gz gpu_carry/drafter/* | tail -n 1 | cut -f1)
    p1=$(((m - s1 + s2) / 2))
    head -c "$p1" "$MODEL" >gpu_carry/model.part1
    tail -c +"$((p1 + 1))" "$MODEL" >gpu_carry/model.part2
    limit=$((64 * 1024 * 1024 - 512 * 1024)) # 64 MiB less room for the tracked scripts
    c1=$((p1 + s1))
    c2=$((m - p1 + s2))
    echo "call 1: $c1 bytes, call 2: $c2 bytes (limit $limit)"
    if ((c1 > limit || c2 > limit)); then
      echo "too large for two calls: split the sampled answers into a call of their own" >&2
      exit 1
    fi
    ls -l gpu_carry
    ;;
  hide)
    [[ -e "$BACKUP" ]] && { echo "already hidden: run '$0 restore' first" >&2; exit 1; }
    mkdir -p "$BACKUP" "$GIT/info"
    cp "$GIT/index" "$BACKUP/index"
    touch "$GIT/info/exclude"
    cp "$GIT/info/exclude" "$BACKUP/exclude"
    git rm -r --cached -q .
    printf '/*\n!/scripts/\n/scripts/*\n!/scripts/dart_gpu/\n' >>"$GIT/info/exclude"
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
