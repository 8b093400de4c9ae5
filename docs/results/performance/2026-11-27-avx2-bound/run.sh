#!/usr/bin/env bash
# Why the AVX2 16-row forward stays near 100 GMAC/s per core (2026-11-27, Zen 4 forced to AVX2).
# Needs gcc and llvm-mca (Debian: apt-get install gcc llvm). Pause the campaign first.
set -euo pipefail
cd "$(dirname "$0")"
OUT="${OUT:-/tmp/avx2-bound}"
mkdir -p "$OUT"
# 1. Throughput of single instructions and of the kernel's steady-state mix (3.66 GHz assumed
#    in the printout: this VM's clock, measured with a chain of dependent adds).
gcc -O2 -mavx2 -mavx512vnni -mavx512vl pipes.c -o "$OUT/pipes" && "$OUT/pipes" | tee "$OUT/pipes.txt"
gcc -O2 -mavx2 loop_mix.c -o "$OUT/loop_mix" && "$OUT/loop_mix" | tee "$OUT/loop_mix.txt"
# 2. The 4-row Q4 tile's block loop as the release build compiled it (objdump of
#    `avx2::matmul_groups`, one iteration = 4 activation rows × 8 weight rows × 32 inputs), on
#    LLVM's Zen 3 model.
llvm-mca -mcpu=znver3 -iterations=200 -resource-pressure -timeline=false q4_tile4_loop.s \
  | tee "$OUT/mca.txt" | sed -n '1,12p'
# 3. The kernel alone, one core, weights in L2, interleaved variants (run on a build with a
#    patch applied for the tried variants):
#    PARADRAFT_ISA=avx2 cargo test --release -p paradraft --lib tile_shapes -- --ignored --nocapture
# 4. Whole forwards of k rows for a few seconds (for perf or A/B), with prof_forward.patch:
#    PARADRAFT_ISA=avx2 PROF_MODEL=<gguf> PROF_K=16 PROF_S=5 \
#      target/release/deps/paradraft-<hash> prof_forward --ignored --nocapture
