//! The CPU's `vpdpbusd` (AVX-512 VNNI, 512-bit) issue rate on one core: CHAINS independent
//! accumulators (default 16, enough to cover the instruction's latency at two a cycle), and the
//! core clock from a chain of dependent register adds (one a cycle). Their ratio says how many
//! `vpdpbusd` a cycle the core issues — the ceiling the int8 matmul tiles are measured against
//! (docs/performance.md, "The int8 kernel against the VNNI ceiling").
//!
//!     cargo run --release --example dpbusd_peak -- [CHAINS]
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::time::Instant;

/// `iters` rounds of `C` independent `vpdpbusd` (one per accumulator); their lane sum.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dpbusd_chains<const C: usize>(iters: u64) -> i32 {
    let (a, b) = (_mm512_set1_epi8(1), _mm512_set1_epi8(2));
    let mut acc = [_mm512_setzero_si512(); C];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm512_dpbusd_epi32(*x, a, b);
        }
    }
    let mut s = _mm512_setzero_si512();
    for x in acc {
        s = _mm512_add_epi32(s, x);
    }
    _mm512_reduce_add_epi32(s)
}

/// GHz from `n` dependent adds (one cycle each).
#[cfg(target_arch = "x86_64")]
fn clock_ghz(n: u64) -> f64 {
    let mut x = 0u64;
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: one register instruction, no memory, no stack.
        unsafe { std::arch::asm!("add {0}, 1", inout(reg) x, options(nomem, nostack)) };
    }
    std::hint::black_box(x);
    n as f64 / t.elapsed().as_secs_f64() / 1e9
}

#[cfg(target_arch = "x86_64")]
fn main() {
    let chains: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(16);
    if !(is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw")) {
        println!("this CPU has no AVX-512 VNNI");
        return;
    }
    let total: u64 = 400_000_000;
    for _ in 0..3 {
        let ghz_before = clock_ghz(300_000_000);
        let t = Instant::now();
        // SAFETY: the features were detected above.
        let sum = unsafe {
            match chains {
                c if c <= 4 => dpbusd_chains::<4>(total / 4),
                c if c <= 8 => dpbusd_chains::<8>(total / 8),
                c if c <= 12 => dpbusd_chains::<12>(total / 12),
                _ => dpbusd_chains::<16>(total / 16),
            }
        };
        let per_ns = total as f64 / t.elapsed().as_secs_f64() / 1e9;
        let ghz = (ghz_before + clock_ghz(300_000_000)) / 2.0;
        println!(
            "{:>2} chains: {per_ns:.2} vpdpbusd/ns = {:.0} GMAC/s one core; clock {ghz:.2} GHz: \
             {:.2} a cycle (check {sum})",
            chains.clamp(4, 16).next_multiple_of(4),
            per_ns * 64.0,
            per_ns / ghz
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("x86-64 only");
}
