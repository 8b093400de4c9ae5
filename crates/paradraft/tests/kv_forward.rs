//! KV-cache and forward invariants: batched == incremental, truncate and compact leave a cache
//! equal to a fresh run over the kept sequence, and a tree forward gives every node the logits
//! of its root path run as a plain sequence. The forward is batch-invariant, so these hold bit
//! for bit (TOL = 0), on dense and on quantized models: speculative verification then
//! reproduces autoregressive decoding exactly.

mod common;
use common::*;
use paradraft::kv::KvCache;
use paradraft::model::{Batch, Loaded, OutputSpec, Scratch, TreeMask};
use paradraft::types::{Pos, SlotId, TokenId};

const TOL: f32 = 0.0;

fn load(name: &str) -> Loaded {
    if name == "llama-quant" {
        paradraft::model::load(&fixtures().join("tiny/llama-quant.gguf")).unwrap()
    } else if name == "moe-kquant" {
        // K-quant experts sliced from their stacks, int8 activations.
        paradraft::model::load(&fixtures().join("quants/tiny-moe-kquant.gguf")).unwrap()
    } else {
        load_tiny(name)
    }
}

fn toks(v: &[u32]) -> Vec<TokenId> {
    v.iter().map(|&t| TokenId(t)).collect()
}

/// Appends `tokens` (causal, at positions following the cache) and returns each row's logits.
fn extend(lm: &Loaded, kv: &mut KvCache, tokens: &[TokenId]) -> Vec<Vec<f32>> {
    let mut s = Scratch::default();
    let pos = seq_positions(kv.len(), tokens.len());
    let out = lm
        .model
        .forward(
            kv,
            &Batch {
                tokens,
                positions: &pos,
                mask: None,
            },
            &OutputSpec::all_full(),
            &mut s,
        )
        .unwrap();
    (0..tokens.len())
        .map(|i| out.logits_row(i).to_vec())
        .collect()
}

fn prompt() -> Vec<TokenId> {
    toks(&[
        3, 17, 250, 99, 42, 7, 311, 128, 64, 5, 200, 18, 77, 301, 9, 45,
    ])
}

#[test]
fn batched_forward_equals_token_by_token() {
    for name in [
        "llama",
        "qwen3",
        "llama-quant",
        "qwen3moe",
        "mixtral",
        "qwen2moe",
        "moe-kquant",
    ] {
        let lm = load(name);
        let p = prompt();
        let batched = run_logits(&lm, &p);
        let mut kv = lm.model.new_kv(32);
        for (i, t) in p.iter().enumerate() {
            let row = extend(&lm, &mut kv, &[*t]);
            let d = max_abs_diff(&row[0], &batched[i]);
            assert!(d <= TOL, "{name} pos {i}: {d}");
        }
    }
}

#[test]
fn truncate_then_continue_equals_fresh_run() {
    let lm = load_tiny("llama");
    let p = prompt();
    let mut kv = lm.model.new_kv(64);
    extend(&lm, &mut kv, &p);
    kv.truncate(9);
    let cont = toks(&[11, 12, 13, 14]);
    let got = extend(&lm, &mut kv, &cont);
    let mut fresh_seq = p[..9].to_vec();
    fresh_seq.extend(&cont);
    let fresh = run_logits(&lm, &fresh_seq);
    for i in 0..cont.len() {
        assert!(max_abs_diff(&got[i], &fresh[9 + i]) <= TOL);
    }
}

/// A tree over the prefix: node tokens and parents (node 0 is the root, the last committed
/// token's successor). Paths: 0-1-3, 0-1-4-6, 0-2-5.
fn tree() -> (Vec<TokenId>, Vec<Option<usize>>) {
    (
        toks(&[21, 22, 23, 24, 25, 26, 27]),
        vec![None, Some(0), Some(0), Some(1), Some(1), Some(2), Some(4)],
    )
}

fn depth(parents: &[Option<usize>], mut i: usize) -> usize {
    let mut d = 0;
    while let Some(p) = parents[i] {
        i = p;
        d += 1;
    }
    d
}

fn root_path(parents: &[Option<usize>], mut i: usize) -> Vec<usize> {
    let mut path = vec![i];
    while let Some(p) = parents[i] {
        path.push(p);
        i = p;
    }
    path.reverse();
    path
}

fn tree_forward(
    lm: &Loaded,
    kv: &mut KvCache,
    tokens: &[TokenId],
    parents: &[Option<usize>],
) -> Vec<Vec<f32>> {
    let prefix = kv.len();
    let pos: Vec<Pos> = (0..tokens.len())
        .map(|i| Pos((prefix + depth(parents, i)) as u32))
        .collect();
    let mask = TreeMask::from_parents(parents).unwrap();
    let mut s = Scratch::default();
    let out = lm
        .model
        .forward(
            kv,
            &Batch {
                tokens,
                positions: &pos,
                mask: Some(&mask),
            },
            &OutputSpec::all_full(),
            &mut s,
        )
        .unwrap();
    (0..tokens.len())
        .map(|i| out.logits_row(i).to_vec())
        .collect()
}

#[test]
fn tree_forward_matches_each_root_path() {
    for name in [
        "llama",
        "qwen2",
        "qwen3",
        "llama-quant",
        "qwen3moe",
        "mixtral",
        "qwen2moe",
        "moe-kquant",
    ] {
        let lm = load(name);
        let p = prompt();
        let (nodes, parents) = tree();
        let mut kv = lm.model.new_kv(64);
        extend(&lm, &mut kv, &p);
        let got = tree_forward(&lm, &mut kv, &nodes, &parents);
        for (i, row) in got.iter().enumerate() {
            let mut seq = p.clone();
            seq.extend(root_path(&parents, i).iter().map(|&j| nodes[j]));
            let want = run_logits(&lm, &seq);
            let d = max_abs_diff(row, want.last().unwrap());
            assert!(d <= TOL, "{name} node {i}: {d}");
        }
    }
}

#[test]
fn tree_forward_on_real_gguf_matches_root_paths() {
    // The quantized mixed-type tiny GGUF exercises the interleaved-rope path with a tree.
    let lm = paradraft::model::load(&fixtures().join("tiny/llama-quant.gguf")).unwrap();
    let p = prompt();
    let (nodes, parents) = tree();
    let mut kv = lm.model.new_kv(64);
    extend(&lm, &mut kv, &p);
    let got = tree_forward(&lm, &mut kv, &nodes, &parents);
    for i in [3, 6, 5] {
        let mut seq = p.clone();
        seq.extend(root_path(&parents, i).iter().map(|&j| nodes[j]));
        let want = run_logits(&lm, &seq);
        assert!(max_abs_diff(&got[i], want.last().unwrap()) <= TOL);
    }
}

#[test]
fn compact_accepted_path_then_continue_equals_fresh_run() {
    let lm = load_tiny("qwen2");
    let p = prompt();
    let (nodes, parents) = tree();
    let mut kv = lm.model.new_kv(64);
    extend(&lm, &mut kv, &p);
    tree_forward(&lm, &mut kv, &nodes, &parents);
    // Accept path 0-1-4-6: its slots are prefix + node index.
    let path = root_path(&parents, 6);
    let slots: Vec<SlotId> = path.iter().map(|&j| SlotId((p.len() + j) as u32)).collect();
    kv.compact(p.len(), &slots).unwrap();
    assert_eq!(kv.len(), p.len() + path.len());
    let cont = toks(&[31, 32]);
    let got = extend(&lm, &mut kv, &cont);
    let mut seq = p.clone();
    seq.extend(path.iter().map(|&j| nodes[j]));
    seq.extend(&cont);
    let want = run_logits(&lm, &seq);
    for i in 0..cont.len() {
        let d = max_abs_diff(&got[i], &want[seq.len() - cont.len() + i]);
        assert!(d <= TOL, "row {i}: {d}");
    }
}

#[test]
fn compact_rejects_bad_slots() {
    let lm = load_tiny("llama");
    let mut kv = lm.model.new_kv(16);
    extend(&lm, &mut kv, &prompt()[..6]);
    assert!(kv.compact(2, &[SlotId(4), SlotId(3)]).is_err());
    assert!(kv.compact(2, &[SlotId(1)]).is_err());
    assert!(kv.compact(2, &[SlotId(9)]).is_err());
    assert_eq!(kv.len(), 6, "a refused compact changes nothing");
}

#[test]
fn fused_argmax_and_top_k_agree_with_full_logits() {
    use paradraft::model::{Logits, Rows};
    let lm = load_tiny("qwen3");
    let p = prompt();
    let full = run_logits(&lm, &p);
    let mut s = Scratch::default();
    for logits in [Logits::Argmax, Logits::TopK(5), Logits::ArgmaxTop(5)] {
        let mut kv = lm.model.new_kv(32);
        let pos = seq_positions(0, p.len());
        let spec = OutputSpec {
            rows: Rows::Some(vec![3, 15]),
            logits,
            taps: vec![],
        };
        let out = lm
            .model
            .forward(
                &mut kv,
                &Batch {
                    tokens: &p,
                    positions: &pos,
                    mask: None,
                },
                &spec,
                &mut s,
            )
            .unwrap();
        for (k, &r) in [3usize, 15].iter().enumerate() {
            let want = paradraft::runtime::ops::top_k(&full[r], 5);
            match logits {
                Logits::Argmax => assert_eq!(out.argmax[k], want[0].0),
                Logits::ArgmaxTop(_) => {
                    assert_eq!(out.argmax[k], want[0].0);
                    let ids: Vec<_> = out.top[k].iter().map(|e| e.0).collect();
                    assert_eq!(ids, want.iter().map(|e| e.0).collect::<Vec<_>>());
                }
                _ => {
                    let ids: Vec<_> = out.top[k].iter().map(|e| e.0).collect();
                    assert_eq!(ids, want.iter().map(|e| e.0).collect::<Vec<_>>());
                }
            }
        }
    }
}

fn long_prompt(n: usize) -> Vec<TokenId> {
    (0..n)
        .map(|i| TokenId(((i * 97 + 31) % 380) as u32 + 3))
        .collect()
}

#[test]
fn invariance_holds_across_attention_slot_chunks() {
    // Contexts longer than the attention's split-K range (128 slots): a chain decoded token by
    // token, a batched forward, and tree nodes whose slots straddle a range boundary all agree
    // bit for bit.
    for name in ["qwen3", "llama-quant"] {
        let lm = load(name);
        let p = long_prompt(140);
        let batched = run_logits(&lm, &p);
        let mut kv = lm.model.new_kv(320);
        extend(&lm, &mut kv, &p[..120]);
        for (i, t) in p.iter().enumerate().skip(120) {
            let row = extend(&lm, &mut kv, &[*t]);
            assert!(max_abs_diff(&row[0], &batched[i]) <= TOL, "{name} pos {i}");
        }
        let prefix = long_prompt(125);
        let (nodes, parents) = tree();
        let mut kv = lm.model.new_kv(320);
        extend(&lm, &mut kv, &prefix);
        let got = tree_forward(&lm, &mut kv, &nodes, &parents);
        for (i, row) in got.iter().enumerate() {
            let mut seq = prefix.clone();
            seq.extend(root_path(&parents, i).iter().map(|&j| nodes[j]));
            let want = run_logits(&lm, &seq);
            assert!(
                max_abs_diff(row, want.last().unwrap()) <= TOL,
                "{name} node {i}"
            );
        }
    }
}
