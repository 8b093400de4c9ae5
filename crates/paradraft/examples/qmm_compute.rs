//! Many-row matmuls on weights that stay in cache, per GGML type: the kernels' arithmetic rate
//! (GMAC/s) where a prefill or a wide verify spends its time, on one thread (or more), with the matrix
//! (2048 × 2048, random values quantized here) and the activation rows reused every pass.
//!
//!     cargo run --release --example qmm_compute -- [ROWS] [TYPES] [COLS] [OUTPUTS]
//!
//! ROWS: activation rows per matmul (default 96); TYPES as for `qmm_stream` (default
//! q4_0,q4_k,q5_k,q6_k,q8_0). `QMM_THREADS=2` splits the row groups over two threads as a
//! forward's matmuls are split.
use paradraft::runtime::qmatmul::QActs;
use std::time::Instant;

mod common;

/// The output shared by the tasks of one matmul, which write disjoint row groups.
struct Out(*mut f32);
// SAFETY: tasks write disjoint elements (see `pass`).
unsafe impl Sync for Out {}

fn main() {
    let mut args = std::env::args().skip(1);
    let rows: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(96);
    let types = args
        .next()
        .unwrap_or_else(|| "q4_0,q4_k,q5_k,q6_k,q8_0".into());
    let cols: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2048);
    let out_rows: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2048);
    // QMM_THREADS=N splits each matmul's row groups over N threads as a forward does.
    let threads: usize = std::env::var("QMM_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    paradraft::runtime::pool::init(threads);
    let mut rnd = common::uniform();
    let x: Vec<f32> = (0..rows * cols).map(|_| rnd()).collect();
    let mut a = QActs::default();
    a.quantize(&x, cols);
    for name in types.split(',') {
        let p = common::random_packed(name, out_rows, cols, &mut rnd);
        let mut out = vec![0f32; rows * out_rows];
        let pass = |out: &mut [f32]| {
            let o = Out(out.as_mut_ptr());
            let o = &o;
            paradraft::runtime::pool::par_ranges(p.groups(), |g0, g1| {
                // SAFETY: `out` holds rows × out_rows values; each task writes its own groups.
                unsafe { p.matmul_groups(&a, g0, g1, o.0, out_rows) };
            });
        };
        pass(&mut out);
        let macs = (rows * out_rows * cols) as f64;
        let best = (0..15)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..4 {
                    pass(&mut out);
                }
                t.elapsed().as_secs_f64() / 4.0
            })
            .fold(f64::INFINITY, f64::min);
        std::hint::black_box(&out);
        println!(
            "{name:7} {rows} rows  {:6.1} GMAC/s  {:7.3} ms",
            macs / best / 1e9,
            best * 1e3
        );
    }
}
