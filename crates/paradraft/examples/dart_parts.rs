//! The committed DART drafter's proposal in parts, after a 300-position context: its layer
//! (`DartModel::forward`, 2 new real slots) and its head (draft-vocabulary logits of the
//! depths), median and least ms of ITERS calls per mask count, two threads; then N requests'
//! calls (7 masks each, each over its own cache) one after another against one batched pass
//! (`DartModel::forward_many` and one head call), layer and head together.
//!
//!     cargo run --release --example dart_parts -- [ITERS]
mod common;

use paradraft::drafters::dart::model::Call;
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
    let f = feat(2);
    for n in [2usize, 4, 8, 16] {
        let mut kvs: Vec<_> = (0..n).map(|_| kv.clone()).collect();
        let (mut apart, mut one) = (vec![], vec![]);
        for i in 0..iters / 4 + 10 {
            let t = Instant::now();
            for kv in kvs.iter_mut() {
                m.forward(&lm.model, kv, &f, &next, 7, &mut s, &mut out)?;
                head.logits(&lm.model, &out, &mut logits);
                kv.truncate(p0);
            }
            let a = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            let mut calls: Vec<Call> = kvs
                .iter_mut()
                .map(|kv| Call {
                    kv,
                    features: &f,
                    next: &next,
                    masks: 7,
                })
                .collect();
            m.forward_many(&lm.model, &mut calls, &mut s, &mut out)?;
            head.logits(&lm.model, &out, &mut logits);
            let b = t.elapsed().as_secs_f64() * 1e3;
            for kv in kvs.iter_mut() {
                kv.truncate(p0);
            }
            if i >= 10 {
                apart.push(a);
                one.push(b);
            }
        }
        for v in [&mut apart, &mut one] {
            v.sort_by(f64::total_cmp);
        }
        println!(
            "{n} calls: apart median {:.3} min {:.3} ms; one pass median {:.3} min {:.3} ms ({:.2}x)",
            apart[apart.len() / 2],
            apart[0],
            one[one.len() / 2],
            one[0],
            apart[apart.len() / 2] / one[one.len() / 2]
        );
    }
    Ok(())
}
