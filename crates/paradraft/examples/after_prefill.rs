//! One-row forwards right after a prompt's prefill, timed by their place after it: on some
//! machines the first few run far slower than the steady ones (docs/performance.md, "Verify
//! rows at real context lengths").
//!
//!     cargo run --release --example after_prefill -- [CONTEXT] [MODEL]
//!
//! CONTEXT: prompt tokens prefilled before each series (default 320); MODEL: a .gguf file or
//! HF directory (default: the fetched SmolLM2). Prints, for the 1st … 10th forward after a
//! prefill, the median ms over 50 series (10 more untimed first), two threads.
mod common;

use paradraft::model::{Batch, Logits, Scratch};
use paradraft::{Pos, TokenId};
use std::time::Instant;

fn main() -> paradraft::Result<()> {
    let mut args = std::env::args().skip(1);
    let ctx: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(320);
    let path = args
        .next()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(paradraft::fetch::default_model_path);
    let (lm, prompt, pos) = common::setup(&path, ctx)?;
    let m = &lm.model;
    let quiet = common::quiet();
    let argmax = common::rows(Logits::Argmax);
    let mut s = Scratch::default();
    let mut kv = m.new_kv(ctx + 2);
    let mut by_place = vec![vec![]; 10];
    for series in 0..60 {
        kv.truncate(0);
        let prefill = Batch {
            tokens: &prompt,
            positions: &pos,
            mask: None,
        };
        m.forward(&mut kv, &prefill, &quiet, &mut s)?;
        for times in by_place.iter_mut() {
            let t = Instant::now();
            let one = Batch {
                tokens: &[TokenId(100)],
                positions: &[Pos(ctx as u32)],
                mask: None,
            };
            m.forward(&mut kv, &one, &argmax, &mut s)?;
            if series >= 10 {
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
            kv.truncate(ctx);
        }
    }
    println!(
        "context {ctx}: median ms of the 1st..10th one-row forward after the prefill: {}",
        common::medians(&mut by_place)
    );
    Ok(())
}
