//! Paged KV caches (#64): caches whose 16-slot tiles live in pages of one shared pool, taken
//! as they grow, scattered and interleaved with other sequences' pages, shared with a cached
//! prefix and copied before a write. Every row must equal the same sequence run alone on a
//! cache of its own, bit for bit (the forward is batch-invariant and attention reads the same
//! values in the same order through the page table).

mod common;
use common::*;
use paradraft::kv::KvCache;
use paradraft::model::{Batch, Loaded, OutputSpec, Scratch, TreeMask};
use paradraft::types::{Pos, SlotId, TokenId};
use paradraft::Error;

fn toks(n: usize, seed: u32) -> Vec<TokenId> {
    (0..n as u32)
        .map(|i| TokenId((i * 37 + seed * 101 + 5) % 300 + 1))
        .collect()
}

/// One multi-sequence forward appending `new[i]` to `kvs[i]` (causal); each row's logits.
fn step(lm: &Loaded, kvs: &mut [&mut KvCache], new: &[&[TokenId]]) -> Vec<Vec<Vec<f32>>> {
    let pos: Vec<Vec<Pos>> = kvs
        .iter()
        .zip(new)
        .map(|(kv, t)| seq_positions(kv.len(), t.len()))
        .collect();
    let mut seqs: Vec<(&mut KvCache, Batch)> = kvs
        .iter_mut()
        .zip(new)
        .zip(&pos)
        .map(|((kv, t), p)| {
            (
                &mut **kv,
                Batch {
                    tokens: t,
                    positions: p,
                    mask: None,
                },
            )
        })
        .collect();
    let mut s = Scratch::default();
    let out = lm
        .model
        .forward_multi(&mut seqs, &OutputSpec::all_full(), &mut s)
        .unwrap();
    let mut r = 0;
    new.iter()
        .map(|t| {
            (0..t.len())
                .map(|_| {
                    r += 1;
                    out.logits_row(r - 1).to_vec()
                })
                .collect()
        })
        .collect()
}

fn load(name: &str) -> Loaded {
    if name == "llama-quant" {
        paradraft::model::load(&fixtures().join("tiny/llama-quant.gguf")).unwrap()
    } else {
        load_tiny(name)
    }
}

/// `got` are the logits of the last `got.len()` positions of `seq`: as a fresh run's.
fn assert_rows(lm: &Loaded, name: &str, got: &[Vec<f32>], seq: &[TokenId]) {
    let want = run_logits(lm, seq);
    for (i, row) in got.iter().enumerate() {
        let at = seq.len() - got.len() + i;
        assert_eq!(max_abs_diff(row, &want[at]), 0.0, "{name}: position {at}");
    }
}

/// Two sequences grown together in chunks of 5 and 7 (their pages interleave), one of them
/// after a hole left by a dropped cache; then a tree round compacted to its accepted path.
#[test]
fn paged_caches_equal_a_cache_of_its_own() {
    for name in [
        "llama",
        "qwen3",
        "llama-quant",
        "qwen3moe",
        "gemma3",
        "qwen2-window",
    ] {
        let lm = load(name);
        let pool = lm.model.new_kv_pool(24).unwrap();
        let mut hole = KvCache::paged(&pool, 64);
        let (a_toks, b_toks) = (toks(47, 1), toks(40, 2));
        let mut a = KvCache::paged(&pool, 96);
        let mut b = KvCache::paged(&pool, 96);
        // `hole` takes pages between a's first ones, then gives them back.
        step(&lm, &mut [&mut a], &[&a_toks[..5]]);
        step(&lm, &mut [&mut hole], &[&toks(33, 3)]);
        let (mut ia, mut ib) = (5, 0);
        let (mut rows_a, mut rows_b) = (vec![], vec![]);
        while ia < a_toks.len() || ib < b_toks.len() {
            let (na, nb) = ((ia + 5).min(a_toks.len()), (ib + 7).min(b_toks.len()));
            let (ta, tb) = (&a_toks[ia..na], &b_toks[ib..nb]);
            if tb.is_empty() {
                rows_a.extend(step(&lm, &mut [&mut a], &[ta]).remove(0));
            } else if ta.is_empty() {
                rows_b.extend(step(&lm, &mut [&mut b], &[tb]).remove(0));
            } else {
                let mut out = step(&lm, &mut [&mut a, &mut b], &[ta, tb]);
                rows_b.extend(out.remove(1));
                rows_a.extend(out.remove(0));
            }
            (ia, ib) = (na, nb);
            if ia == 20 {
                drop(std::mem::replace(&mut hole, KvCache::paged(&pool, 1)));
            }
        }
        assert_rows(&lm, name, &rows_a, &a_toks);
        assert_rows(&lm, name, &rows_b, &b_toks);
        // A tree after b's prompt (nodes at slots 40..47, across a page boundary), its path
        // 0-1-4-6 kept, then one more token.
        let nodes = toks(7, 9);
        let parents = [None, Some(0), Some(0), Some(1), Some(1), Some(2), Some(4)];
        let depth = [0u32, 1, 1, 2, 2, 2, 3];
        let pos: Vec<Pos> = depth.iter().map(|d| Pos(40 + d)).collect();
        let mask = TreeMask::from_parents(&parents).unwrap();
        let mut s = Scratch::default();
        let spec = OutputSpec::all_full();
        let tree = Batch {
            tokens: &nodes,
            positions: &pos,
            mask: Some(&mask),
        };
        let out = lm.model.forward(&mut b, &tree, &spec, &mut s).unwrap();
        let mut seq = b_toks.clone();
        seq.extend([0, 1, 4, 6].map(|j| nodes[j]));
        assert_rows(&lm, name, &[out.logits_row(6).to_vec()], &seq);
        let path: Vec<SlotId> = [0u32, 1, 4, 6].iter().map(|j| SlotId(40 + j)).collect();
        b.compact(40, &path).unwrap();
        let next = toks(1, 11);
        let got = step(&lm, &mut [&mut b], &[&next]);
        seq.extend(&next);
        assert_rows(&lm, name, &got[0], &seq);
        drop((a, b, hole));
        assert_eq!(pool.free_pages(), pool.pages(), "{name}: every page back");
    }
}

/// A cached prefix shares its whole pages and holds a copy of its partial one; a request that
/// reuses it shares every page and copies the partial one before writing: the prefix's owner,
/// the entry and two requests that continue differently all stay exact.
#[test]
fn a_shared_prefix_is_copied_on_write() {
    let lm = load_tiny("qwen3");
    let pool = lm.model.new_kv_pool(16).unwrap();
    let p = toks(45, 4);
    let mut owner = KvCache::paged(&pool, 64);
    step(&lm, &mut [&mut owner], &[&p]);
    assert_eq!(pool.free_pages(), 13);
    let entry = owner.prefix(37).unwrap();
    assert_eq!((entry.lent_pages(), entry.own_pages()), (2, 1));
    assert_eq!(pool.free_pages(), 12);
    let (mut x, mut y) = (KvCache::paged(&pool, 64), KvCache::paged(&pool, 64));
    x.copy_from(&entry, 37).unwrap();
    y.copy_from(&entry, 30).unwrap();
    assert_eq!(pool.free_pages(), 12, "a hit takes no page");
    let (cx, cy, co) = (toks(6, 5), toks(9, 6), toks(3, 7));
    let out = step(&lm, &mut [&mut x, &mut y, &mut owner], &[&cx, &cy, &co]);
    for (rows, base, cont) in [(&out[0], 37, &cx), (&out[1], 30, &cy), (&out[2], 45, &co)] {
        let mut seq = p[..base].to_vec();
        seq.extend(cont.iter());
        assert_rows(&lm, "qwen3", rows, &seq);
    }
    assert_eq!(x.own_pages(), 1, "x copied the partial page");
    assert_eq!(
        y.own_pages(),
        2,
        "y copied its partial page and took one more"
    );
    // The entry still holds the prefix: a request from it now equals one from scratch.
    let mut z = KvCache::paged(&pool, 64);
    z.copy_from(&entry, 37).unwrap();
    let got = step(&lm, &mut [&mut z], &[&cx]);
    let mut seq = p[..37].to_vec();
    seq.extend(&cx);
    assert_rows(&lm, "qwen3", &got[0], &seq);
    drop((owner, entry, x, y, z));
    assert_eq!(pool.free_pages(), pool.pages());
}

/// A pool out of pages is an error of the forward, not a panic, and loses no page.
#[test]
fn an_exhausted_pool_is_an_error() {
    let lm = load_tiny("llama");
    let pool = lm.model.new_kv_pool(2).unwrap();
    let mut kv = KvCache::paged(&pool, 64);
    let p = toks(40, 8);
    let pos = seq_positions(0, p.len());
    let b = Batch {
        tokens: &p,
        positions: &pos,
        mask: None,
    };
    let e = lm
        .model
        .forward(
            &mut kv,
            &b,
            &OutputSpec::all_full(),
            &mut Scratch::default(),
        )
        .err();
    assert!(
        matches!(e, Some(Error::KvPoolFull { needed: 1, free: 0 })),
        "{e:?}"
    );
    kv.clear();
    assert_eq!(pool.free_pages(), 2);
    assert!(lm.model.new_kv_pool(0).is_err());
}

/// Timing (ignored; run with `--ignored --nocapture`, nothing else on the cores): 16 decode
/// rows of SmolLM2 over 16 sequences of `PAGED_CTX` (default 400) cached tokens, their caches
/// of their own against pages of one pool filled round-robin (each sequence's tiles scattered
/// among the others'), interleaved, median ms of 40 steps per round.
#[test]
#[ignore]
fn paged_decode_timing() {
    let path = paradraft::fetch::ensure_default_model().unwrap();
    let lm = paradraft::model::load(&path).unwrap();
    let ctx: usize = std::env::var("PAGED_CTX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let n = 16;
    let pool = lm
        .model
        .new_kv_pool(n * (ctx + 64).div_ceil(16) + 8)
        .unwrap();
    let mut own: Vec<KvCache> = (0..n).map(|_| lm.model.new_kv(ctx + 64)).collect();
    let mut paged: Vec<KvCache> = (0..n).map(|_| KvCache::paged(&pool, ctx + 64)).collect();
    let prompts: Vec<Vec<TokenId>> = (0..n).map(|i| toks(ctx, i as u32)).collect();
    let chunk: usize = std::env::var("PAGED_CHUNK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    for set in [&mut own, &mut paged] {
        // Round-robin chunks of 16: each sequence takes a page, then the next one does.
        for c in (0..ctx).step_by(chunk) {
            let mut kvs: Vec<&mut KvCache> = set.iter_mut().collect();
            let new: Vec<&[TokenId]> = prompts
                .iter()
                .map(|p| &p[c..(c + chunk).min(ctx)])
                .collect();
            step(&lm, &mut kvs, &new);
        }
    }
    let spec = OutputSpec {
        rows: paradraft::model::Rows::All,
        logits: paradraft::model::Logits::Argmax,
        taps: vec![],
    };
    let mut s = Scratch::default();
    let mut time = |set: &mut Vec<KvCache>| {
        let mut ms = vec![];
        for _ in 0..40 {
            let pos: Vec<Vec<Pos>> = set.iter().map(|kv| seq_positions(kv.len(), 1)).collect();
            let tok = [TokenId(42)];
            let mut seqs: Vec<(&mut KvCache, Batch)> = set
                .iter_mut()
                .zip(&pos)
                .map(|(kv, p)| {
                    (
                        kv,
                        Batch {
                            tokens: &tok,
                            positions: p,
                            mask: None,
                        },
                    )
                })
                .collect();
            let t = std::time::Instant::now();
            lm.model.forward_multi(&mut seqs, &spec, &mut s).unwrap();
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            for kv in set.iter_mut() {
                kv.truncate(kv.len() - 1);
            }
        }
        ms.sort_by(f64::total_cmp);
        ms[ms.len() / 2]
    };
    for round in 0..4 {
        let (a, b) = (time(&mut own), time(&mut paged));
        eprintln!(
            "round {round}: own {a:.2} ms, paged {b:.2} ms ({:+.1} %)",
            100.0 * (b / a - 1.0)
        );
    }
}
