//! k-row forwards after a CTX-token prefill (default 64), in a loop: the median and least ms of
//! ITERS forwards (20 more untimed first), two threads; a steady target for `perf record`
//! (docs/performance.md, "Few-row forwards").
//!
//!     cargo run --release --example rows_loop -- [K] [ITERS] [full|argmax|last|last-full|none] [CTX]
//!
//! K: rows per forward (default 4); ITERS (default 500); `full` (default): every row's logits;
//! `argmax`: the fused argmax output instead; `last` / `last-full`: the argmax / the logits of
//! the last row alone; `none`: no output layer (the body's cost). The model is the fetched
//! SmolLM2. `PRE=N` runs an untimed forward of N rows (no output layer) before each timed one,
//! as a verify of N rows precedes the next round's forward; `GAP_US=N` then idles N µs (in
//! 50 µs sleeps), as drafting leaves the second thread idle (docs/performance.md, "A forward
//! after a wider one, or after idling").
mod common;

use paradraft::model::{Batch, Logits, OutputSpec, Rows, Scratch};
use paradraft::{Pos, TokenId};
use std::time::{Duration, Instant};

fn main() -> paradraft::Result<()> {
    let mut args = std::env::args().skip(1);
    let k: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let iters: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(500);
    let (logits, rows) = match args.next().as_deref() {
        None | Some("full") => (Logits::Full, Rows::All),
        Some("argmax") => (Logits::Argmax, Rows::All),
        Some("last") => (Logits::Argmax, Rows::Last),
        Some("last-full") => (Logits::Full, Rows::Last),
        Some("none") => (Logits::None, Rows::All),
        Some(other) => {
            return Err(paradraft::Error::BadRequest(format!(
                "output mode `{other}`: expected full, argmax, last, last-full or none"
            )))
        }
    };
    let ctx: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let (lm, prompt, pos) = common::setup(&paradraft::fetch::default_model_path(), ctx)?;
    let m = &lm.model;
    let spec = OutputSpec {
        rows,
        ..common::rows(logits)
    };
    let mut s = Scratch::default();
    let env = |name: &str| -> paradraft::Result<u64> {
        match std::env::var(name) {
            Ok(v) => v.parse().map_err(|_| {
                paradraft::Error::BadRequest(format!("{name}={v}: expected a whole number"))
            }),
            Err(_) => Ok(0),
        }
    };
    let (pre, gap) = (env("PRE")? as usize, Duration::from_micros(env("GAP_US")?));
    let mut kv = m.new_kv(ctx + k.max(pre) + 1);
    let prefill = Batch {
        tokens: &prompt,
        positions: &pos,
        mask: None,
    };
    m.forward(&mut kv, &prefill, &common::quiet(), &mut s)?;
    // n new rows after the prefill: tokens from `first`, positions from ctx.
    let rows_of = |n: usize, first: u32| -> (Vec<TokenId>, Vec<Pos>) {
        let toks = (0..n).map(|i| TokenId(first + i as u32)).collect();
        (toks, (0..n).map(|i| Pos((ctx + i) as u32)).collect())
    };
    let ((toks, ps), (ptoks, pps)) = (rows_of(k, 100), rows_of(pre, 200));
    let batch = |tokens, positions| Batch {
        tokens,
        positions,
        mask: None,
    };
    let (step, wider) = (batch(&toks, &ps), batch(&ptoks, &pps));
    let body = common::rows(Logits::None);
    let mut times = vec![];
    for i in 0..iters + 20 {
        if pre > 0 {
            m.forward(&mut kv, &wider, &body, &mut s)?;
            kv.truncate(ctx);
        }
        let idle = Instant::now();
        while idle.elapsed() < gap {
            std::thread::sleep(Duration::from_micros(50));
        }
        let t = Instant::now();
        m.forward(&mut kv, &step, &spec, &mut s)?;
        if i >= 20 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        kv.truncate(ctx);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "k={k} (after {pre} rows): median {:.3} ms, min {:.3}",
        times[times.len() / 2],
        times[0]
    );
    Ok(())
}
