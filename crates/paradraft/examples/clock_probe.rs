//! Is it the core's clock that makes a forward slower after a wider one or after idling
//! (docs/notebook.md, "A forward after a wider one, or after idling")? Times a dependent
//! integer chain — a fixed number of cycles per step whatever the caches hold — in slices right
//! after an event, on the calling thread; a slower step means a slower clock (this VM exposes no
//! cycle counters). Events: `probe` (right after another probe: the steady clock), a 1-row and a
//! K-row forward after a CTX-token prefill (default 16 and 300), 5 ms asleep, 5 ms spinning.
//! Median over REPEATS (default 200) of each slice's ns per step, events interleaved.
//!
//!     cargo run --release --example clock_probe -- [REPEATS] [K] [CTX]
mod common;

use paradraft::model::{Batch, Logits, Scratch};
use paradraft::{Pos, TokenId};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Steps per slice (≈ 25 µs on the Xeon) and slices per trace.
const STEPS: u64 = 30_000;
const SLICES: usize = 24;

/// A chain of `n` multiply-adds, each waiting for the one before: a fixed number of cycles a step
/// on x86-64 (`imul` then `add`, in inline assembly so that the compiler cannot fold steps
/// together; 0.79–0.81 ns a step on the 2026-11-26 Xeon).
#[cfg(target_arch = "x86_64")]
fn chain(n: u64, seed: u64) -> u64 {
    let mut x = seed;
    for _ in 0..n {
        // SAFETY: two register instructions, no memory, no stack.
        unsafe {
            std::arch::asm!("imul {0}, {0}", "add {0}, 1", inout(reg) x, options(nomem, nostack));
        }
    }
    x
}

/// Elsewhere a xorshift-multiply chain (not calibrated in cycles).
#[cfg(not(target_arch = "x86_64"))]
fn chain(n: u64, seed: u64) -> u64 {
    let mut x = seed;
    for _ in 0..n {
        x = black_box((x ^ (x >> 7)).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    }
    x
}

/// ns per step of each slice, back to back.
fn trace(out: &mut [Vec<f64>]) {
    for slice in out.iter_mut() {
        let t = Instant::now();
        black_box(chain(STEPS, black_box(7)));
        slice.push(t.elapsed().as_secs_f64() * 1e9 / STEPS as f64);
    }
}

fn main() -> paradraft::Result<()> {
    let mut args = std::env::args().skip(1);
    let repeats: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let k: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(16);
    let ctx: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(300);
    let (lm, prompt, pos) = common::setup(&paradraft::fetch::default_model_path(), ctx)?;
    let m = &lm.model;
    let mut s = Scratch::default();
    let mut kv = m.new_kv(ctx + k + 1);
    let prefill = Batch {
        tokens: &prompt,
        positions: &pos,
        mask: None,
    };
    m.forward(&mut kv, &prefill, &common::quiet(), &mut s)?;
    let rows = |n: usize| -> (Vec<TokenId>, Vec<Pos>) {
        let toks = (0..n).map(|i| TokenId(100 + i as u32)).collect();
        (toks, (0..n).map(|i| Pos((ctx + i) as u32)).collect())
    };
    let ((t1, p1), (tk, pk)) = (rows(1), rows(k));
    let full = common::rows(Logits::Full);
    let events = [
        "probe",
        "1-row forward",
        "K-row forward",
        "5 ms asleep",
        "5 ms spinning",
    ];
    let mut traces = vec![vec![vec![]; SLICES]; events.len()];
    for r in 0..repeats + 5 {
        for (e, trace_of) in traces.iter_mut().enumerate() {
            match e {
                0 => trace(&mut vec![vec![]; SLICES]),
                1 | 2 => {
                    let (t, p) = if e == 1 { (&t1, &p1) } else { (&tk, &pk) };
                    let b = Batch {
                        tokens: t,
                        positions: p,
                        mask: None,
                    };
                    m.forward(&mut kv, &b, &full, &mut s)?;
                    kv.truncate(ctx);
                }
                3 => std::thread::sleep(Duration::from_millis(5)),
                _ => {
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_millis(5) {
                        black_box(chain(1000, black_box(3)));
                    }
                }
            }
            if r >= 5 {
                trace(trace_of);
            } else {
                trace(&mut vec![vec![]; SLICES]);
            }
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "ns per chain step, median of {repeats}, slices of {STEPS} steps; K = {k}, \
         context {ctx}"
    );
    let shown = [0, 1, 2, 4, 8, 12, 16, 23];
    print!("{:>16}", "slice:");
    for i in shown {
        print!(" {i:>6}");
    }
    println!();
    for (name, tr) in events.iter().zip(traces.iter_mut()) {
        let name = name.replace('K', &k.to_string());
        print!("{name:>16}");
        for i in shown {
            print!(" {:>6.3}", med(&mut tr[i]));
        }
        println!();
    }
    Ok(())
}
