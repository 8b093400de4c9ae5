//! One-row matmuls streaming packed weights from DRAM, per GGML type: how many GB/s of the
//! packed form each type's kernel reads, on 1 and 2 threads (each thread its own half of every
//! matrix's row groups, no synchronisation), against the plain read rate of the machine. The
//! matrices (2048 × 8192 each, 256 MiB or more in all) are random values quantized here.
//!
//!     cargo run --release --example qmm_stream -- [ITERS] [TYPES]
//!
//! TYPES: comma-separated GGML type names, any with a quantiser here (`quant::quantiser`: q4_0,
//! q4_1, q5_0, q5_1, q8_0, q2_k … q6_k, iq4_nl, iq4_xs; default q4_0,q4_k,q5_k,q6_k,q8_0).
use paradraft::runtime::qmatmul::{Packed, QActs, GROUP};
use std::time::Instant;

mod common;

const ROWS: usize = 2048;
const COLS: usize = 8192;

/// Seconds for `iters` passes over every matrix, `threads` threads splitting each one's groups.
fn time(ms: &[Packed], a: &QActs, threads: usize, iters: usize) -> f64 {
    let groups = ROWS / GROUP;
    let t = Instant::now();
    std::thread::scope(|s| {
        for th in 0..threads {
            s.spawn(move || {
                let mut out = vec![0f32; ROWS];
                let (g0, g1) = (th * groups / threads, (th + 1) * groups / threads);
                for _ in 0..iters {
                    for m in ms {
                        // SAFETY: `out` holds ROWS values for the one activation row.
                        unsafe { m.matmul_groups(a, g0, g1, out.as_mut_ptr(), ROWS) };
                    }
                }
                std::hint::black_box(&out);
            });
        }
    });
    t.elapsed().as_secs_f64()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let iters: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(8);
    let types = args
        .next()
        .unwrap_or_else(|| "q4_0,q4_k,q5_k,q6_k,q8_0".into());
    let mut rnd = common::uniform();
    let x: Vec<f32> = (0..COLS).map(|_| rnd()).collect();
    let mut a = QActs::default();
    a.quantize(&x, COLS);
    for name in types.split(',') {
        let one = common::random_packed(name, ROWS, COLS, &mut rnd);
        let copies = (256usize << 20).div_ceil(one.nbytes());
        let ms: Vec<Packed> = (0..copies).map(|_| one.clone()).collect();
        let bytes = (copies * one.nbytes()) as f64;
        time(&ms, &a, 2, 1);
        let mut line = format!("{name:7} {:6.1} MiB", bytes / (1u64 << 20) as f64);
        for threads in [1, 2] {
            let best = (0..3)
                .map(|_| time(&ms, &a, threads, iters))
                .fold(f64::INFINITY, f64::min);
            line += &format!(
                "  {threads}t {:5.1} GB/s",
                bytes * iters as f64 / best / 1e9
            );
        }
        println!("{line}");
    }
}
