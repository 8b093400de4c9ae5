//! Times one forward over `k` new tokens after `ctx` cached ones, `iters` times, and prints the
//! minimum and median in ms: a steady loop for `perf record` and for interleaved A/B runs of
//! two builds (the k-token point of `paradraft bench-kernels`, without llama.cpp).
//!
//! `cargo run --release --example forward_loop -- K ITERS [CTX=64] [full|argmax] [MODEL]`

use paradraft::model::{self, Batch, Logits, OutputSpec, Rows, Scratch};
use paradraft::{Pos, TokenId};
use std::time::Instant;

fn main() -> paradraft::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: usize| {
        args.get(i)
            .map(|s| s.parse().expect("a number"))
            .unwrap_or(default)
    };
    let (k, iters, ctx) = (num(0, 16).max(1), num(1, 100).max(1), num(2, 64).max(1));
    let logits = match args.get(3).map(String::as_str) {
        Some("argmax") => Logits::Argmax,
        _ => Logits::Full,
    };
    let path = match args.get(4) {
        Some(p) => p.into(),
        None => paradraft::fetch::ensure_default_model()?,
    };
    paradraft::runtime::init_threads(2);
    let m = model::load(&path)?.model;
    let vocab = m.config.vocab_size as u32;
    let toks: Vec<TokenId> = (0..(ctx + k) as u32)
        .map(|i| TokenId((i * 7919 + 13) % vocab))
        .collect();
    let pos: Vec<Pos> = (0..(ctx + k) as u32).map(Pos).collect();
    let (mut kv, mut s) = (m.new_kv(ctx + k), Scratch::default());
    let batch = |a: usize, b: usize| Batch {
        tokens: &toks[a..b],
        positions: &pos[a..b],
        mask: None,
    };
    let context = OutputSpec {
        rows: Rows::Last,
        logits: Logits::None,
        taps: vec![],
    };
    m.forward(&mut kv, &batch(0, ctx), &context, &mut s)?;
    let spec = OutputSpec {
        rows: Rows::All,
        logits,
        taps: vec![],
    };
    let mut ms = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        m.forward(&mut kv, &batch(ctx, ctx + k), &spec, &mut s)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        kv.truncate(ctx);
    }
    ms.sort_by(f64::total_cmp);
    println!("k={k} min {:.2} med {:.2} ms", ms[0], ms[ms.len() / 2]);
    Ok(())
}
