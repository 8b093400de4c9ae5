//! The committed DART drafter's proposal in parts, after a 300-position context: its layer
//! (`DartModel::forward`, 2 new real slots) and its head (draft-vocabulary logits of the
//! depths), median and least ms of ITERS calls per mask count, two threads.
//!
//!     cargo run --release --example dart_parts -- [ITERS]
mod common;

use paradraft::drafters::dart::DartModel;
use paradraft::TokenId;
use std::path::Path;
use std::time::Instant;

fn main() -> paradraft::Result<()> {
    let iters: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(300);
    let ctx = 300;
    let (lm, prompt, _) = common::setup(&paradraft::fetch::default_model_path(), ctx)?;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../drafters/smollm2-135m-dart");
    let (m, mut head) = DartModel::load(&dir, true)?;
    let w = m.feature_width();
    let feat = |n: usize| -> Vec<f32> {
        (0..n * w)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect()
    };
    let mut kv = m.new_kv(ctx + 16);
    let (mut s, mut out, mut logits) = (Default::default(), vec![], vec![]);
    m.forward(
        &lm.model,
        &mut kv,
        &feat(ctx - 1),
        &prompt[1..],
        0,
        &mut s,
        &mut out,
    )?;
    let p0 = kv.len();
    let next = [TokenId(100), TokenId(200)];
    for masks in [0, 1, 2, 3, 5, 7] {
        let (mut fw, mut hd) = (vec![], vec![]);
        let f = feat(2);
        for i in 0..iters + 20 {
            let t = Instant::now();
            m.forward(&lm.model, &mut kv, &f, &next, masks, &mut s, &mut out)?;
            let a = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            head.logits(&lm.model, &out, &mut logits);
            let b = t.elapsed().as_secs_f64() * 1e3;
            kv.truncate(p0);
            if i >= 20 {
                fw.push(a);
                hd.push(b);
            }
        }
        for v in [&mut fw, &mut hd] {
            v.sort_by(f64::total_cmp);
        }
        println!(
            "masks {masks}: layer median {:.3} min {:.3} ms; head median {:.3} min {:.3} ms",
            fw[iters / 2],
            fw[0],
            hd[iters / 2],
            hd[0]
        );
    }
    Ok(())
}
