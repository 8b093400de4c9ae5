#!/usr/bin/env bash
# The device side of scripts/dflash_gpu/stage.sh's calls (run from the tree's root there).
#   stage          what a staging call carries (GGUF parts, the CPU binary, sampled answers)
#                  into /tmp/pd
#   train MINUTES [train.py options]
#                  the GGUF joined, train.py for MINUTES; the best drafter (split), its log back
#   bench          bench-kernels at 1–16 threads and bench at 16 threads (T = 0 and 1), all in
#                  one tarball ($OUT returns at most 8 files), the trained DFlash
#                  drafter (or the start one) as the default
set -uo pipefail
P=/tmp/pd
OUT="${OUT:-$P/out}"
mkdir -p "$P" "$OUT"
case "${1:-}" in
  stage)
    cp gpu_carry/c*/model.part* "$P/" 2>/dev/null
    cp gpu_carry/c*/sampled.bin.gz "$P/" 2>/dev/null
    for b in gpu_carry/c*/paradraft.gz; do
      [[ -f "$b" ]] || continue
      gunzip -c "$b" >"$P/paradraft" && chmod +x "$P/paradraft"
      ldd "$P/paradraft" | grep 'not found' && echo "the binary misses libraries"
      nvidia-smi -L; nproc; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available())'
    done
    ls -l "$P"
    ;;
  train)
    c=$(dirname "$(ls gpu_carry/c*/samples.bin.gz | head -n 1)")
    cp gpu_carry/c*/model.part* "$P/" 2>/dev/null
    cat "$P"/model.part* >"$P/m.gguf"
    rm -rf "$P/start" && cp -r "$c/drafter" "$P/start"
    sampled=()
    [[ -f "$P/sampled.bin.gz" ]] && sampled=(--sampled "$P/sampled.bin.gz")
    python3 scripts/dflash_gpu/train.py --model "$P/m.gguf" --samples "$c/samples.bin.gz" "${sampled[@]}" \
      --drafter "$P/start" --out "$P/run" --state "$P/state.pt" --minutes "${2:-7.5}" "${@:3}" >"$OUT/log.txt" 2>&1
    echo "train.py: exit $?"
    tail -n 4 "$OUT/log.txt" | cut -c1-400
    cp "$P/run/log.jsonl" "$OUT/" 2>/dev/null
    if [[ -f "$P/run/drafter/model.safetensors" ]]; then
      split -b 15M "$P/run/drafter/model.safetensors" "$OUT/drafter.st."
      cp "$P/run/drafter/config.json" "$P/run/best.json" "$OUT/"
    else
      echo "no drafter beat the start"
    fi
    ;;
  bench)
    H="$P/home"
    rm -rf "$H" && cp -r "$(dirname "$(ls -d gpu_carry/c*/home | head -n 1)")/home" "$H"
    for g in "$H"/ngram/*.gz; do gunzip "$g"; done
    mkdir -p "$H/models"
    if [[ -f "$P/run/drafter/model.safetensors" ]]; then
      cp -r "$P/run/drafter" "$H/drafters/smollm2-135m-dflash"
    else
      cp -r "$P/start" "$H/drafters/smollm2-135m-dflash"
    fi
    export PARADRAFT_HOME="$H"
    # $OUT returns at most 8 files: everything goes into one tarball.
    B="$P/bench" && rm -rf "$B" && mkdir -p "$B"
    lscpu >"$B/lscpu.txt"
    for t in 1 2 4 8 16; do
      "$P/paradraft" bench-kernels --model "$P/m.gguf" --threads "$t" --repeats 3 --json >"$B/kernels_t$t.json" 2>"$B/kernels_t$t.err"
      echo "bench-kernels --threads $t: exit $?"
    done
    for temp in 0 1; do
      "$P/paradraft" bench --model "$P/m.gguf" --threads 16 --methods dart,dflash,auto --datasets gsm8k,mt_bench \
        --num-prompts 4 --temperature "$temp" --out "$B/bench16_t$temp" >"$B/bench16_t$temp.txt" 2>&1
      echo "bench --threads 16 --temperature $temp: exit $?"
      grep '^|' "$B/bench16_t$temp.txt"
    done
    rm -f "$B"/bench16_t*/*.svg
    tar czf "$OUT/bench.tgz" -C "$P" bench
    ;;
  *) echo "usage: $0 stage|train MINUTES|bench" >&2; exit 2 ;;
esac
