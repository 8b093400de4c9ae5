mod common;
use paradraft::model::{Batch, Logits, OutputSpec, Rows, Scratch};
use paradraft::{Pos, TokenId};
use std::time::Instant;

fn main() -> paradraft::Result<()> {
    let mut args = std::env::args().skip(1);
    let k: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let iters: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(300);
    let full = args.next().as_deref() != Some("argmax");
    let lg = if full { Logits::Full } else { Logits::Argmax };
    let ctx = 64;
    let (lm, prompt, pos) = common::setup(&paradraft::fetch::default_model_path(), ctx)?;
    let m = &lm.model;
    let spec = OutputSpec {
        rows: Rows::All,
        ..common::rows(lg)
    };
    let mut s = Scratch::default();
    let mut kv = m.new_kv(ctx + k + 2);
    m.forward(
        &mut kv,
        &Batch {
            tokens: &prompt,
            positions: &pos,
            mask: None,
        },
        &common::quiet(),
        &mut s,
    )?;
    let toks: Vec<TokenId> = (0..k).map(|i| TokenId(100 + i as u32)).collect();
    let ps: Vec<Pos> = (0..k).map(|i| Pos((ctx + i) as u32)).collect();
    let many = Batch {
        tokens: &toks,
        positions: &ps,
        mask: None,
    };
    let one = Batch {
        tokens: &toks[..1],
        positions: &ps[..1],
        mask: None,
    };
    let (mut after, mut alone) = (vec![], vec![]);
    for i in 0..iters + 10 {
        // Alone: two one-row forwards in a row, time the second.
        m.forward(&mut kv, &one, &spec, &mut s)?;
        kv.truncate(ctx);
        let t = Instant::now();
        m.forward(&mut kv, &one, &spec, &mut s)?;
        let a = t.elapsed().as_secs_f64() * 1e3;
        kv.truncate(ctx);
        // After: a k-row forward, then a one-row one, time the one-row one.
        m.forward(&mut kv, &many, &spec, &mut s)?;
        kv.truncate(ctx);
        let t = Instant::now();
        m.forward(&mut kv, &one, &spec, &mut s)?;
        let b = t.elapsed().as_secs_f64() * 1e3;
        kv.truncate(ctx);
        if i >= 10 {
            alone.push(a);
            after.push(b);
        }
    }
    for v in [&mut alone, &mut after] {
        v.sort_by(f64::total_cmp);
    }
    println!("k={k} full={full}: one row alone median {:.3} min {:.3}; after a {k}-row forward median {:.3} min {:.3}",
        alone[alone.len()/2], alone[0], after[after.len()/2], after[0]);
    Ok(())
}
