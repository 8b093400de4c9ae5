#!/usr/bin/env bash
# Builds paradraft for AArch64 and runs its kernel tests there under emulation (qemu-user),
# so the NEON `sdot` kernels are checked against the portable reference on an x86 machine.
#
#   scripts/test_neon.sh            install what is missing (Debian packages), build, then run
#                                   the kernel tests (runtime::: every kernel against the
#                                   reference, and each row's bits alone and in a batch) and, on
#                                   the tiny models, the forward tests kv_forward and tiny_parity
#                                   (≈ 4 min under emulation; `batching` adds 3.5 min and checks
#                                   nothing the kernel tests do not, so CI leaves it out)
#   scripts/test_neon.sh FILTER...  only the library tests matching FILTER
#
# The toolchain comes from Debian: `rustc-web`/`cargo-web` (Rust ≥ 1.87, this crate's minimum: llguidance needs it)
# with the AArch64 standard library `libstd-rust-web-dev:arm64` (multiarch), the cross linker
# `gcc-aarch64-linux-gnu` and `qemu-user`. The test binary is linked statically: dynamically
# linked binaries hang in `pthread_create` under Debian 12's qemu-aarch64 7.2.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo_() { if [[ $(id -u) == 0 ]]; then "$@"; else sudo "$@"; fi; }
if ! [[ -d /usr/lib/rustlib/aarch64-unknown-linux-gnu ]] || ! command -v qemu-aarch64 >/dev/null ||
  ! command -v aarch64-linux-gnu-gcc >/dev/null; then
  sudo_ dpkg --add-architecture arm64
  sudo_ apt-get update -qq
  sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    rustc-web cargo-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross \
    qemu-user >/dev/null
fi
# Debian's compiler: the one whose AArch64 standard library is installed.
export RUSTC=/usr/bin/rustc
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR_NEON:-target/neon}"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static"
# A CPU with the dot-product extension (Neoverse N1), so the `neon` kernels are the ones detected.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu neoverse-n1"
echo "rustc: $($RUSTC --version); qemu: $(qemu-aarch64 --version | head -1)"
run() { /usr/bin/cargo test --locked --release -p paradraft --target aarch64-unknown-linux-gnu "$@"; }
if [[ $# -gt 0 ]]; then
  run --lib -- "$@"
else
  run --lib -- runtime::
  run --test kv_forward --test tiny_parity
fi
