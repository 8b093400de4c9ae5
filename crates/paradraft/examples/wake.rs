//! One-row forwards after different kinds of work, timed by their place after it: what slows a
//! decode step that follows a drafted round (docs/performance.md, "What a drafted round leaves
//! behind").
//!
//!     cargo run --release --example wake -- [CONTEXT] [MODEL]
//!
//! Before each series of 6 one-row forwards (after CONTEXT cached tokens, default 200) one of:
//! `none` (the previous series' steps), `rows16` (a 16-row forward of the target: heavy matmul
//! and its weights), `sweep64` (reading 64 MB of other memory: cache pollution without heavy
//! arithmetic), `fma2ms` (2 ms of 512-bit FMAs on registers on this thread: heavy arithmetic
//! without memory, where the CPU has AVX-512), `idle2ms` (2 ms asleep). Medians over 40 series
//! each, the kinds interleaved, two threads.
mod common;

use paradraft::drafters::dart::DartModel;
use paradraft::model::{Batch, Logits, Scratch};
use paradraft::{Pos, TokenId};
use std::time::{Duration, Instant};

#[cfg(target_arch = "x86_64")]
fn fma_for(ms: f64) -> f32 {
    if !std::arch::is_x86_feature_detected!("avx512f") {
        return 0.0;
    }
    // SAFETY: avx512f was detected above.
    unsafe { fma512(ms) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma512(ms: f64) -> f32 {
    use std::arch::x86_64::*;
    let t = Instant::now();
    let mut acc = [_mm512_set1_ps(1.0); 8];
    let m = _mm512_set1_ps(0.999_999);
    let a = _mm512_set1_ps(1e-7);
    while t.elapsed().as_secs_f64() * 1e3 < ms {
        for _ in 0..1000 {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, m, a);
            }
        }
    }
    acc.iter().map(|&x| _mm512_reduce_add_ps(x)).sum()
}

#[cfg(not(target_arch = "x86_64"))]
fn fma_for(_ms: f64) -> f32 {
    0.0
}

fn main() -> paradraft::Result<()> {
    let mut args = std::env::args().skip(1);
    let ctx: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let path = args
        .next()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(paradraft::fetch::default_model_path);
    let (lm, prompt, pos) = common::setup(&path, ctx + 16)?;
    let m = &lm.model;
    let argmax = common::rows(Logits::Full);
    let full = common::rows(Logits::Full);
    let mut s = Scratch::default();
    let mut kv = m.new_kv(ctx + 20);
    m.forward(
        &mut kv,
        &Batch {
            tokens: &prompt[..ctx],
            positions: &pos[..ctx],
            mask: None,
        },
        &common::quiet(),
        &mut s,
    )?;
    let sweep: Vec<u64> = (0..8 << 20).collect();
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../drafters/smollm2-135m-dart");
    let (dart, mut head) = DartModel::load(&dir, true)?;
    let w = dart.feature_width();
    let feat: Vec<f32> = (0..ctx * w)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let mut dkv = dart.new_kv(ctx + 16);
    let (mut ds, mut dout, mut dlogits) = (Default::default(), vec![], vec![]);
    dart.forward(
        m,
        &mut dkv,
        &feat[..(ctx - 1) * w],
        &prompt[1..ctx],
        0,
        &mut ds,
        &mut dout,
    )?;
    let d0 = dkv.len();
    let kinds = [
        "none",
        "rows16",
        "sweep64",
        "fma2ms",
        "idle2ms",
        "dart_layer",
        "dart_propose",
        "with_taps",
    ];
    let mut tapped = common::rows(Logits::Full);
    tapped.taps = paradraft::drafters::dart::dart_taps(m.config.n_layers)?;
    let mut by: Vec<Vec<Vec<f64>>> = vec![vec![vec![]; 6]; kinds.len()];
    let mut sink = 0u64;
    let mut fsink = 0f32;
    for series in 0..50 {
        for (k, kind) in kinds.iter().enumerate() {
            match *kind {
                "rows16" => {
                    m.forward(
                        &mut kv,
                        &Batch {
                            tokens: &prompt[ctx..ctx + 16],
                            positions: &pos[ctx..ctx + 16],
                            mask: None,
                        },
                        &full,
                        &mut s,
                    )?;
                    kv.truncate(ctx);
                }
                "sweep64" => sink = sink.wrapping_add(sweep.iter().sum::<u64>()),
                "fma2ms" => fsink += fma_for(2.0),
                "idle2ms" => std::thread::sleep(Duration::from_millis(2)),
                "dart_layer" | "dart_propose" => {
                    let masks = if *kind == "dart_layer" { 0 } else { 3 };
                    let next = [TokenId(100), TokenId(200)];
                    dart.forward(
                        m,
                        &mut dkv,
                        &feat[..2 * w],
                        &next,
                        masks,
                        &mut ds,
                        &mut dout,
                    )?;
                    if masks > 0 {
                        head.logits(m, &dout, &mut dlogits);
                    }
                    dkv.truncate(d0);
                }
                _ => {}
            }
            for times in by[k].iter_mut() {
                let t = Instant::now();
                let one = Batch {
                    tokens: &[TokenId(100)],
                    positions: &[Pos(ctx as u32)],
                    mask: None,
                };
                let spec = if *kind == "with_taps" {
                    &tapped
                } else {
                    &argmax
                };
                m.forward(&mut kv, &one, spec, &mut s)?;
                if series >= 10 {
                    times.push(t.elapsed().as_secs_f64() * 1e3);
                }
                kv.truncate(ctx);
            }
        }
    }
    for (kind, places) in kinds.iter().zip(by.iter_mut()) {
        println!(
            "{kind:>8}: 1st..6th one-row forward ms {}",
            common::medians(places)
        );
    }
    eprintln!("({sink} {fsink})");
    Ok(())
}
