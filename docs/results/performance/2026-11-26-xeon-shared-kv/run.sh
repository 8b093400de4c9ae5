#!/usr/bin/env bash
# Attention work units of up to 4 new tokens sharing the K/V tiles they all see (the build
# before and after): `bench-kernels` at 64 and 320 cached tokens, OLD and NEW release binaries
# interleaved in two rounds with the order swapped (the PAR_ROWS A/B's script). ISA=avx2
# forces the AVX2 kernels (PARADRAFT_ISA) and writes to avx2/. Pauses the training campaign.
#   OLD=/tmp/pd_old NEW=/tmp/pd_new [ISA=avx2] bash docs/results/performance/2026-11-26-xeon-shared-kv/run.sh
set -euo pipefail
cd "$(dirname "$0")"
OUT=$PWD CONTEXTS="64 320" exec bash ../2026-11-26-xeon-parrows/run.sh
