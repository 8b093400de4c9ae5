//! Whether AVX-512 code runs slower right after AMX tile work (#63's unmeasured suspect for
//! why AMX matmuls that won alone lost in whole forwards), and what a tile burst costs.
//!
//! A fixed AVX-512 VNNI workload (`vpdpbusd` chains on registers, ~10 µs) is timed alone, and
//! right after a burst of AMX-INT8 work: `ldtilecfg`, tile loads, `n` × `tdpbssd`, a tile
//! store, then `tilerelease` (or not: the tile state kept configured). Each case runs in
//! rounds interleaved with the others; the medians of the workload's and the burst's times
//! are printed. Needs a CPU with AMX-INT8 and Linux's permission for the tile data.
//!
//! `cargo run --release --example amx_switch -- [rounds]`

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::time::Instant;

    #[repr(C, align(64))]
    struct Cfg([u8; 64]);

    fn cfg() -> Cfg {
        // Palette 1; tiles 0..7 all 16 rows × 64 bytes.
        let mut c = [0u8; 64];
        c[0] = 1;
        for t in 0..8 {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&64u16.to_le_bytes());
            c[48 + t] = 16;
        }
        Cfg(c)
    }

    /// The AVX-512 workload: `iters` rounds of 8 independent `vpdpbusd` chains.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn avx512_work(iters: usize, seed: i32) -> i32 {
        let a = _mm512_set1_epi32(seed | 0x01010101);
        let b = _mm512_set1_epi32(0x02030405);
        let mut acc = [_mm512_setzero_si512(); 8];
        for _ in 0..iters {
            for r in acc.iter_mut() {
                *r = _mm512_dpbusd_epi32(*r, a, b);
            }
        }
        let mut s = acc[0];
        for r in &acc[1..] {
            s = _mm512_add_epi32(s, *r);
        }
        _mm512_reduce_add_epi32(s)
    }

    /// One AMX burst: configure (unless `cfg` is `None`: configured before), load A and B, `n` multiplies into C, store C, and release
    /// the tile state when `release`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn amx_burst(
        cfg: Option<&Cfg>,
        a: &[u8],
        b: &[u8],
        c: &mut [i32],
        n: usize,
        chains: bool,
        rotate: bool,
        release: bool,
    ) {
        if let Some(cfg) = cfg {
            asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        }
        asm!(
            "tilezero tmm0",
            "tileloadd tmm1, [{a} + {s}*1]",
            "tileloadd tmm2, [{b} + {s}*1]",
            a = in(reg) a.as_ptr(),
            b = in(reg) b.as_ptr(),
            s = in(reg) 64usize,
            options(nostack, readonly),
        );
        if chains && !rotate {
            // `n` blocks as a matmul kernel runs them: zero C, load A and B, multiply, store C
            // (each block's own scales need its int32 sums in memory).
            for i in 0..n {
                asm!(
                    "tilezero tmm0",
                    "tileloadd tmm1, [{a} + {s}*1]",
                    "tileloadd tmm2, [{b} + {s}*1]",
                    "tdpbssd tmm0, tmm1, tmm2",
                    "tilestored [{c} + {s}*1], tmm0",
                    a = in(reg) a.as_ptr(),
                    b = in(reg) b.as_ptr(),
                    c = in(reg) c.as_mut_ptr().add((i % 4) * 256),
                    s = in(reg) 64usize,
                    options(nostack),
                );
            }
        } else if rotate {
            // The same blocks with four C tiles in turn (tmm0, tmm3, tmm4, tmm5), so a block's
            // zeroing need not wait for the store of the block before.
            macro_rules! block {
                ($c:literal, $i:expr) => {
                    asm!(
                        concat!("tilezero ", $c),
                        "tileloadd tmm1, [{a} + {s}*1]",
                        "tileloadd tmm2, [{b} + {s}*1]",
                        concat!("tdpbssd ", $c, ", tmm1, tmm2"),
                        concat!("tilestored [{c} + {s}*1], ", $c),
                        a = in(reg) a.as_ptr(),
                        b = in(reg) b.as_ptr(),
                        c = in(reg) c.as_mut_ptr().add(($i % 4) * 256),
                        s = in(reg) 64usize,
                        options(nostack),
                    )
                };
            }
            for i in (0..n).step_by(4) {
                block!("tmm0", i);
                block!("tmm3", i + 1);
                block!("tmm4", i + 2);
                block!("tmm5", i + 3);
            }
        } else {
            for _ in 0..n {
                asm!("tdpbssd tmm0, tmm1, tmm2", options(nostack, nomem));
            }
        }
        asm!(
            "tilestored [{c} + {s}*1], tmm0",
            c = in(reg) c.as_mut_ptr(),
            s = in(reg) 64usize,
            options(nostack),
        );
        if release {
            asm!("tilerelease", options(nostack, nomem));
        }
    }

    pub fn main() {
        let has = std::arch::is_x86_feature_detected!("avx512vnni");
        // CPUID leaf 7: EDX bit 24 AMX-TILE, bit 25 AMX-INT8.
        let edx = __cpuid_count(7, 0).edx;
        let amx = edx & (3 << 24) == 3 << 24;
        if !(has && amx) {
            eprintln!("this CPU lacks AVX-512 VNNI or AMX-INT8: nothing to measure");
            return;
        }
        if !paradraft::runtime::isa::tiles_usable() {
            eprintln!(
                "the OS did not grant the tile data (ARCH_REQ_XCOMP_PERM): nothing to measure"
            );
            return;
        }
        let rounds: usize = std::env::args()
            .nth(1)
            .and_then(|a| a.parse().ok())
            .unwrap_or(2000);
        let (cfg, a, b) = (cfg(), vec![1u8; 1024], vec![2u8; 1024]);
        let mut c = vec![0i32; 1024];
        let work = 2000;
        // (name, burst multiplies, as kernel blocks (0: bare multiplies; 1: one C tile; 2: four), configure, release, idle µs before the
        // workload)
        type Case = (&'static str, Option<usize>, u8, bool, bool, u64);
        let cases: [Case; 12] = [
            ("avx512 alone", None, 0, true, true, 0),
            (
                "after 1 tdpbssd, configured, released",
                Some(1),
                0,
                true,
                true,
                0,
            ),
            (
                "after 1 tdpbssd, configured, kept",
                Some(1),
                0,
                true,
                false,
                0,
            ),
            (
                "after 1 tdpbssd, configured before, kept",
                Some(1),
                0,
                false,
                false,
                0,
            ),
            (
                "after 64 tdpbssd, configured before, kept",
                Some(64),
                0,
                false,
                false,
                0,
            ),
            (
                "after 64 tdpbssd, configured, released",
                Some(64),
                0,
                true,
                true,
                0,
            ),
            (
                "after 512 tdpbssd, configured, released",
                Some(512),
                0,
                true,
                true,
                0,
            ),
            (
                "after 512 tdpbssd, released, 20 µs spin",
                Some(512),
                0,
                true,
                true,
                20,
            ),
            (
                "after 16 blocks (zero, 2 loads, tdpbssd, store), configured before",
                Some(16),
                1,
                false,
                false,
                0,
            ),
            (
                "after 128 blocks, configured before",
                Some(128),
                1,
                false,
                false,
                0,
            ),
            (
                "after 16 blocks, four C tiles in turn",
                Some(16),
                2,
                false,
                false,
                0,
            ),
            (
                "after 128 blocks, four C tiles in turn",
                Some(128),
                2,
                false,
                false,
                0,
            ),
        ];
        let mut w = vec![Vec::with_capacity(rounds); cases.len()];
        let mut t_burst = vec![Vec::with_capacity(rounds); cases.len()];
        let mut sink = 0i32;
        for r in 0..rounds + 50 {
            for (i, &(_, burst, chains, configure, release, gap)) in cases.iter().enumerate() {
                if burst.is_some() && !configure {
                    // Configured outside the timed burst (the previous case may have released).
                    // SAFETY: as below.
                    unsafe { amx_burst(Some(&cfg), &a, &b, &mut c, 0, false, false, false) };
                }
                let t0 = Instant::now();
                if let Some(n) = burst {
                    // SAFETY: AMX-INT8 is present and granted; A and B hold 16 × 64 bytes, C 4 tiles.
                    let cfg = configure.then_some(&cfg);
                    unsafe { amx_burst(cfg, &a, &b, &mut c, n, chains > 0, chains > 1, release) };
                    sink ^= c[r % 256];
                }
                let t1 = Instant::now();
                while t1.elapsed().as_micros() < gap as u128 {
                    std::hint::spin_loop();
                }
                let t2 = Instant::now();
                // SAFETY: AVX-512 VNNI is present.
                sink ^= unsafe { avx512_work(work, r as i32) };
                let t3 = Instant::now();
                if r >= 50 {
                    w[i].push((t3 - t2).as_secs_f64() * 1e6);
                    t_burst[i].push((t1 - t0).as_secs_f64() * 1e6);
                }
            }
        }
        // SAFETY: releasing tile state that may be configured is always allowed.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v[v.len() / 2], v[v.len() / 10])
        };
        println!("{rounds} rounds; AVX-512 workload {work} × 8 vpdpbusd; medians (p10) in µs");
        println!("| case | workload | burst |");
        println!("|---|---|---|");
        for (i, &(name, ..)) in cases.iter().enumerate() {
            let (wm, wp) = med(&mut w[i]);
            let (bm, bp) = med(&mut t_burst[i]);
            println!("| {name} | {wm:.2} ({wp:.2}) | {bm:.2} ({bp:.2}) |");
        }
        std::hint::black_box(sink);
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    imp::main();
    #[cfg(not(target_arch = "x86_64"))]
    eprintln!("x86-64 only");
}
