//! What one AMX-INT8 matmul block costs, taken apart (#63): a block is 16 activation rows ×
//! 16 weight rows × one 32-input block (A tile 16 × 32 bytes, B tile 8 × 64 bytes, C tile
//! 16 × 16 int32), and per-32-block scales force its int32 sums through memory to AVX-512
//! registers. Each variant runs `n` blocks back to back from L1-resident buffers; the median
//! time per block (and its p10) over many rounds is printed, in ns and in core cycles.
//!
//! `cargo run --release --example amx_blocks -- [rounds]`

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::time::Instant;

    #[repr(C, align(64))]
    struct Cfg([u8; 64]);

    /// Palette 1: C tiles tmm0..tmm3 (16 × 64 bytes), A tiles tmm4/tmm5 (16 × 32 bytes), B
    /// tiles tmm6/tmm7 (8 × 64 bytes).
    fn cfg() -> Cfg {
        let mut c = [0u8; 64];
        c[0] = 1;
        let shapes = [
            (16u8, 64u16),
            (16, 64),
            (16, 64),
            (16, 64),
            (16, 32),
            (16, 32),
            (8, 64),
            (8, 64),
        ];
        for (t, &(rows, colsb)) in shapes.iter().enumerate() {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
            c[48 + t] = rows;
        }
        Cfg(c)
    }

    #[repr(C, align(64))]
    struct Bufs {
        /// 16 A blocks, rows 32 bytes apart in a 16 × 32-byte block... (stride 64 per row).
        a: [u8; 16 * 1024],
        /// 16 B tiles of 512 bytes.
        b: [u8; 16 * 512],
        /// A ring of 4 stored C tiles.
        c: [[i32; 256]; 4],
        /// C tiles no tile store writes (the epilogue without the store-to-load dependency).
        far: [[i32; 256]; 4],
        /// Per-row scales for the epilogue.
        d: [f32; 64],
    }

    #[derive(Clone, Copy, PartialEq)]
    enum V {
        Tdp,
        ZeroTdpStore,
        Store,
        LoadB,
        BTdpStore,
        ABTdpStore,
        Epilogue,
        BTdpStoreEpilogue,
        ABTdpStoreEpilogue,
        BTdpStoreEpilogueFar,
    }

    /// C tile `$c` of block `$i`: zeroed, multiplied by A `$a` and B `$b`, and the loads and the
    /// store each variant includes.
    macro_rules! block {
        ($v:expr, $bufs:expr, $i:expr, $c:literal, $a:literal, $b:literal) => {{
            let i: usize = $i;
            let pa = $bufs.a.as_ptr().add((i % 16) * 1024);
            let pb = $bufs.b.as_ptr().add((i % 16) * 512);
            let pc = $bufs.c[i % 4].as_mut_ptr();
            match $v {
                V::Tdp => asm!(concat!("tdpbssd ", $c, ", ", $a, ", ", $b), options(nostack, nomem)),
                V::ZeroTdpStore => asm!(
                    concat!("tilezero ", $c),
                    concat!("tdpbssd ", $c, ", ", $a, ", ", $b),
                    concat!("tilestored [{c} + {s}*1], ", $c),
                    c = in(reg) pc, s = in(reg) 64usize, options(nostack)),
                V::Store => asm!(
                    concat!("tilestored [{c} + {s}*1], ", $c),
                    c = in(reg) pc, s = in(reg) 64usize, options(nostack)),
                V::LoadB => asm!(
                    concat!("tileloadd ", $b, ", [{b} + {s}*1]"),
                    b = in(reg) pb, s = in(reg) 64usize, options(nostack, readonly)),
                V::BTdpStore | V::BTdpStoreEpilogue | V::BTdpStoreEpilogueFar => asm!(
                    concat!("tilezero ", $c),
                    concat!("tileloadd ", $b, ", [{b} + {s}*1]"),
                    concat!("tdpbssd ", $c, ", ", $a, ", ", $b),
                    concat!("tilestored [{c} + {s}*1], ", $c),
                    b = in(reg) pb, c = in(reg) pc, s = in(reg) 64usize, options(nostack)),
                V::ABTdpStore | V::ABTdpStoreEpilogue => asm!(
                    concat!("tilezero ", $c),
                    concat!("tileloadd ", $a, ", [{a} + {s}*1]"),
                    concat!("tileloadd ", $b, ", [{b} + {s}*1]"),
                    concat!("tdpbssd ", $c, ", ", $a, ", ", $b),
                    concat!("tilestored [{c} + {s}*1], ", $c),
                    a = in(reg) pa, b = in(reg) pb, c = in(reg) pc, s = in(reg) 64usize,
                    options(nostack)),
                V::Epilogue => {}
            }
        }};
    }

    /// The AVX-512 epilogue of the block stored two blocks earlier: per row, its int32 sums
    /// loaded, converted, scaled (d_w · d_x) and accumulated, plus the min term's FMA.
    #[inline(always)]
    unsafe fn epilogue(
        bufs: &Bufs,
        i: usize,
        far: bool,
        acc: &mut [__m512; 16],
        accm: &mut [__m512; 8],
    ) {
        let c = if far {
            bufs.far[i % 4].as_ptr()
        } else {
            bufs.c[(i + 2) % 4].as_ptr()
        };
        let dw = _mm512_loadu_ps(bufs.d.as_ptr().add(i % 32));
        let mw = _mm512_loadu_ps(bufs.d.as_ptr().add(16 + i % 32));
        for t in 0..16 {
            let s = _mm512_load_si512(c.add(t * 16) as *const _);
            let dx = _mm512_set1_ps(*bufs.d.get_unchecked(t + (i & 7)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, dx), acc[t]);
            let sx = _mm512_set1_ps(*bufs.d.get_unchecked(t + 32));
            accm[t % 8] = _mm512_fmadd_ps(mw, sx, accm[t % 8]);
        }
    }

    /// `n` blocks of variant `v` (a multiple of 4), C tiles in turn, A and B tiles in turn.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn run(v: V, bufs: &mut Bufs, n: usize) -> f32 {
        let mut acc = [_mm512_setzero_ps(); 16];
        let mut accm = [_mm512_setzero_ps(); 8];
        let epi = matches!(
            v,
            V::Epilogue | V::BTdpStoreEpilogue | V::ABTdpStoreEpilogue | V::BTdpStoreEpilogueFar
        );
        let far = v == V::BTdpStoreEpilogueFar;
        for i in (0..n).step_by(4) {
            block!(v, bufs, i, "tmm0", "tmm4", "tmm6");
            if epi {
                epilogue(bufs, i, far, &mut acc, &mut accm);
            }
            block!(v, bufs, i + 1, "tmm1", "tmm5", "tmm7");
            if epi {
                epilogue(bufs, i + 1, far, &mut acc, &mut accm);
            }
            block!(v, bufs, i + 2, "tmm2", "tmm4", "tmm6");
            if epi {
                epilogue(bufs, i + 2, far, &mut acc, &mut accm);
            }
            block!(v, bufs, i + 3, "tmm3", "tmm5", "tmm7");
            if epi {
                epilogue(bufs, i + 3, far, &mut acc, &mut accm);
            }
        }
        let mut s = _mm512_setzero_ps();
        for a in acc.iter().chain(accm.iter()) {
            s = _mm512_add_ps(s, *a);
        }
        _mm512_reduce_add_ps(s)
    }

    /// The core's clock, from a chain of dependent one-cycle register adds (a chain of
    /// immediate adds is folded by this Xeon's renamer and reads ~4x too fast).
    fn core_ghz() -> f64 {
        let mut best = f64::MAX;
        for _ in 0..50 {
            let t0 = Instant::now();
            let mut x = 0u64;
            for _ in 0..100_000 {
                // SAFETY: register arithmetic only.
                unsafe {
                    asm!("add {0}, {1}", "add {0}, {1}", "add {0}, {1}", "add {0}, {1}",
                         "add {0}, {1}", "add {0}, {1}", "add {0}, {1}", "add {0}, {1}",
                         inout(reg) x, in(reg) 1u64, options(nostack, nomem));
                }
            }
            std::hint::black_box(x);
            best = best.min(t0.elapsed().as_secs_f64());
        }
        // ~8 dependent adds a loop iteration, the loop's own add and branch beside them.
        800_000.0 / best / 1e9
    }

    fn tsc_ghz() -> f64 {
        // SAFETY: rdtsc has no preconditions.
        let (t0, c0) = (Instant::now(), unsafe { _rdtsc() });
        while t0.elapsed().as_millis() < 50 {}
        let c1 = unsafe { _rdtsc() };
        (c1 - c0) as f64 / t0.elapsed().as_secs_f64() / 1e9
    }

    pub fn main() {
        let edx = __cpuid_count(7, 0).edx;
        if edx & (3 << 24) != 3 << 24 || !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("this CPU lacks AMX-INT8 or AVX-512: nothing to measure");
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
        let mut bufs = Box::new(Bufs {
            a: [1; 16 * 1024],
            b: [2; 16 * 512],
            c: [[0; 256]; 4],
            far: [[3; 256]; 4],
            d: [0.5; 64],
        });
        let cases: [(&str, V); 10] = [
            ("tdpbssd alone (4 C tiles in turn)", V::Tdp),
            ("tilezero + tdpbssd + C store", V::ZeroTdpStore),
            ("C store alone", V::Store),
            ("B load alone", V::LoadB),
            ("B load + zero + tdpbssd + C store (A kept)", V::BTdpStore),
            ("A and B loads + zero + tdpbssd + C store", V::ABTdpStore),
            ("the AVX-512 epilogue alone (16 rows)", V::Epilogue),
            ("B load .. C store, then the epilogue", V::BTdpStoreEpilogue),
            (
                "A, B loads .. C store, then the epilogue",
                V::ABTdpStoreEpilogue,
            ),
            (
                "B load .. C store, the epilogue of tiles not stored to",
                V::BTdpStoreEpilogueFar,
            ),
        ];
        let n = 64;
        let cfg = cfg();
        // SAFETY: AMX-INT8 present and granted; every tile is configured before use, and the
        // buffers hold what each variant reads and writes.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
            asm!("tileloadd tmm4, [{a} + {s}*1]", "tileloadd tmm5, [{a} + {s}*1]",
                 "tileloadd tmm6, [{b} + {s}*1]", "tileloadd tmm7, [{b} + {s}*1]",
                 a = in(reg) bufs.a.as_ptr(), b = in(reg) bufs.b.as_ptr(), s = in(reg) 64usize,
                 options(nostack, readonly));
        }
        let mut times = vec![Vec::with_capacity(rounds); cases.len()];
        let mut sink = 0f32;
        for r in 0..rounds + 20 {
            for (k, &(_, v)) in cases.iter().enumerate() {
                let t0 = Instant::now();
                // SAFETY: as above.
                sink += unsafe { run(v, &mut bufs, n) };
                let dt = t0.elapsed().as_secs_f64() * 1e9 / n as f64;
                if r >= 20 {
                    times[k].push(dt);
                }
            }
        }
        // SAFETY: releasing the tile state is always allowed.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
        let (ghz, core) = (tsc_ghz(), core_ghz());
        println!(
            "{rounds} rounds of {n} blocks; median (p10) per block; TSC {ghz:.2} GHz, core ~{core:.2} GHz"
        );
        println!("| variant | ns / block | core cycles |");
        println!("|---|---|---|");
        for (k, &(name, _)) in cases.iter().enumerate() {
            let v = &mut times[k];
            v.sort_by(f64::total_cmp);
            let (m, p) = (v[v.len() / 2], v[v.len() / 10]);
            println!("| {name} | {m:.1} ({p:.1}) | {:.0} |", m * core);
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
