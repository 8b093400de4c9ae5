//! DART (docs/dart.md): a drafter in the published layout (BOOL `t2d` included) loads; the
//! inference runtime and the training graph compute the same logits (shifted slots, mask slots,
//! double norm), also across calls that reuse the drafter's cache; every trainable tensor gets a
//! gradient; speculative decoding with DART is token-identical to AR greedy; drafters that do
//! not fit their target are refused. Each with one layer (the paper's) and with two; a drafter
//! grown by a layer drafts what it drafted before.

mod common;

use candle_core::{Device, Tensor};
use common::load_tiny;
use paradraft::drafters::dart::{dart_taps, Dart, DartConfig, DartModel};
use paradraft::drafters::parts::Selection;
use paradraft::drafters::vocab::DraftVocab;
use paradraft::generate::{generate, GenerateParams};
use paradraft::model::Loaded;
use paradraft::sample::SamplingParams;
use paradraft::speculative::tree_search::{TreeDrafting, TreeSearchParams};
use paradraft::speculative::{speculative_generate, Speculation};
use paradraft::train::dart::net::{Batch, Net};
use paradraft::train::dart::{config_for, export, load_exported};
use paradraft::types::TokenId;

const MASKS: usize = 3;

fn tiny_config(lm: &Loaded, vocab: &DraftVocab, layers: usize) -> DartConfig {
    let mut c = config_for(&lm.model, MASKS, vocab.len());
    c.layer.n_layers = layers;
    c.layer.n_heads = 4;
    c.layer.n_kv_heads = 2;
    c.layer.head_dim = 16;
    c.layer.intermediate_size = 96;
    c
}

fn reduced(n: usize) -> DraftVocab {
    DraftVocab::from_d2t((0..n as u32).filter(|i| i % 3 != 1).collect(), n)
}

/// An untrained drafter exported in the published layout (f32 so both paths share weights).
fn drafter_dir(
    lm: &Loaded,
    vocab: &DraftVocab,
    seed: u64,
    layers: usize,
) -> (tempfile::TempDir, Net) {
    let net = Net::init(tiny_config(lm, vocab, layers), seed, None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    export(&net, vocab, dir.path(), candle_core::DType::F32).unwrap();
    (dir, net)
}

fn pseudo_random(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
            (x % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

#[test]
fn published_layout_loads_with_its_bool_t2d() {
    let lm = load_tiny("llama");
    let n = lm.model.config.vocab_size;
    let vocab = reduced(n);
    let (dir, _) = drafter_dir(&lm, &vocab, 1, 1);
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["draft_length"], MASKS);
    assert_eq!(cfg["draft_vocab_size"], vocab.len());
    let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("t2d").unwrap().dtype(), safetensors::Dtype::BOOL);
    assert_eq!(st.tensor("d2t").unwrap().dtype(), safetensors::Dtype::I64);
    for name in [
        "fc.weight",
        "midlayer.mask_rep",
        "midlayer.hidden_norm.weight",
        "midlayer.self_attn.q_proj.weight",
        "lm_head.weight",
        "norm.weight",
    ] {
        assert!(st.tensor(name).is_ok(), "{name}");
    }
    let (m, head) = DartModel::load(dir.path(), false).unwrap();
    assert_eq!(head.vocab, vocab);
    assert_eq!(m.config.draft_length, MASKS);
    let (_, v2) = load_exported(dir.path()).unwrap();
    assert_eq!(v2, vocab);
}

/// Runtime logits of one call: `m` real slots from position `p0` (the cache holds `p0`).
fn runtime_logits(lm: &Loaded, dir: &std::path::Path, calls: &[(usize, usize)]) -> Vec<Vec<f32>> {
    let (m, mut head) = DartModel::load(dir, false).unwrap();
    let w = m.feature_width();
    let mut kv = m.new_kv(64);
    let mut s = paradraft::drafters::dart::model::Scratch::default();
    let toks: Vec<TokenId> = (0..40).map(|i| TokenId((i * 7 + 3) % 300 + 20)).collect();
    let feats = pseudo_random(40 * w, 5);
    let mut out = vec![];
    for &(p0, m_) in calls {
        assert_eq!(kv.len(), p0);
        let mut hidden = vec![];
        m.forward(
            &lm.model,
            &mut kv,
            &feats[p0 * w..(p0 + m_) * w],
            &toks[p0 + 1..=p0 + m_],
            MASKS,
            &mut s,
            &mut hidden,
        )
        .unwrap();
        let mut logits = vec![];
        head.logits(&lm.model, &hidden, &mut logits);
        out.push(logits);
    }
    out
}

/// The training graph's logits for the same positions: clean slots 0..m, one block of masks
/// for the prefix ending at m − 1.
fn graph_logits(lm: &Loaded, net: &Net, m: usize) -> Vec<f32> {
    let w = 3 * lm.model.config.hidden_size;
    let h = lm.model.config.hidden_size;
    let toks: Vec<TokenId> = (0..40).map(|i| TokenId((i * 7 + 3) % 300 + 20)).collect();
    let feats = pseudo_random(40 * w, 5);
    let mut emb = vec![0f32; m * h];
    for i in 0..m {
        lm.model
            .embed_row(toks[i + 1].idx(), &mut emb[i * h..(i + 1) * h]);
    }
    let g = (m - 1) as u32;
    let mut positions: Vec<u32> = (0..m as u32).collect();
    let mut ranges: Vec<[(u32, u32); 2]> = (0..m as u32).map(|i| [(0, i + 1), (0, 0)]).collect();
    for j in 1..=MASKS as u32 {
        positions.push(g + j);
        ranges.push([(0, g + 1), (m as u32, m as u32 + j)]);
    }
    let b = Batch {
        features: Tensor::from_vec(feats[..m * w].to_vec(), (m, w), &Device::Cpu).unwrap(),
        next_emb: Tensor::from_vec(emb, (m, h), &Device::Cpu).unwrap(),
        masks: MASKS,
        positions,
        ranges,
        out: (g..g + 1 + MASKS as u32).collect(),
    };
    net.forward(&b)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// Largest absolute difference of two equally long rows.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

#[test]
fn training_graph_matches_the_inference_runtime_across_calls() {
    let lm = load_tiny("llama");
    let vocab = reduced(lm.model.config.vocab_size);
    for layers in [1, 2] {
        let (dir, _) = drafter_dir(&lm, &vocab, 2, layers);
        let (net, _) = load_exported(dir.path()).unwrap();
        // One call over 9 real slots, and the same positions fed as 5 + 4 (the second call
        // reads the first call's real slots from the cache; its masks were dropped).
        let one = runtime_logits(&lm, dir.path(), &[(0, 9)]);
        let two = runtime_logits(&lm, dir.path(), &[(0, 5), (5, 4)]);
        let graph5 = graph_logits(&lm, &net, 5);
        let graph9 = graph_logits(&lm, &net, 9);
        for (what, a, b) in [
            ("cache reuse", &one[0], &two[1]),
            ("9 slots", &one[0], &graph9),
            ("5 slots", &two[0], &graph5),
        ] {
            let d = max_diff(a, b);
            assert!(d < 1e-5, "{layers} layers, {what}: {d}");
        }
        assert_eq!(one[0].len(), (MASKS + 1) * vocab.len());
        // The comparison can fail: logits are far larger than the tolerance, and other
        // positions give other logits.
        let scale = one[0].iter().fold(0f32, |a, x| a.max(x.abs()));
        assert!(scale > 0.2, "logit scale {scale}");
        assert!(max_diff(&one[0][..vocab.len()], &graph5[..vocab.len()]) > 0.05);
    }
}

/// A drafter grown by a layer (`train dart --grow`) gives the logits it gave before, in the
/// training graph and at inference; the layer it gained is there and trainable.
#[test]
fn a_grown_drafter_drafts_what_it_drafted() {
    let lm = load_tiny("llama");
    let vocab = reduced(lm.model.config.vocab_size);
    let (_, net) = drafter_dir(&lm, &vocab, 5, 1);
    let before = graph_logits(&lm, &net, 9);
    let grown = net.grow(2, 7).unwrap();
    assert_eq!(grown.config.layer.n_layers, 2);
    assert!(grown.vars.contains_key("layers.1.self_attn.q_proj.weight"));
    // Equal up to the sums' order (the first layer's MLP now runs over every slot).
    let d = max_diff(&before, &graph_logits(&lm, &grown, 9));
    assert!(d < 1e-6, "{d}");
    let dir = tempfile::tempdir().unwrap();
    export(&grown, &vocab, dir.path(), candle_core::DType::F32).unwrap();
    let rt = runtime_logits(&lm, dir.path(), &[(0, 9)]);
    assert!(max_diff(&before, &rt[0]) < 1e-5);
    let (back, _) = load_exported(dir.path()).unwrap();
    assert_eq!(back.config.layer.n_layers, 2);
    assert!(grown.grow(1, 7).is_err(), "a drafter does not shrink");
}

#[test]
fn every_trainable_tensor_gets_a_gradient() {
    use paradraft::train::bf16::{set_matmul_precision, MatmulPrecision};
    // In f32, and with bf16 products where the CPU has them (its own backward).
    for p in [MatmulPrecision::F32, MatmulPrecision::Bf16] {
        set_matmul_precision(p);
        every_trainable_tensor_gets_a_gradient_in();
    }
    set_matmul_precision(MatmulPrecision::F32);
}

fn every_trainable_tensor_gets_a_gradient_in() {
    let lm = load_tiny("llama");
    let vocab = reduced(lm.model.config.vocab_size);
    let net = Net::init(tiny_config(&lm, &vocab, 2), 4, None).unwrap();
    let logits = {
        let w = 3 * lm.model.config.hidden_size;
        let h = lm.model.config.hidden_size;
        let m = 6;
        let b = Batch {
            features: Tensor::from_vec(pseudo_random(m * w, 1), (m, w), &Device::Cpu).unwrap(),
            next_emb: Tensor::from_vec(pseudo_random(m * h, 2), (m, h), &Device::Cpu).unwrap(),
            masks: 2 * MASKS,
            positions: vec![0, 1, 2, 3, 4, 5, 2, 3, 4, 5, 6, 7],
            ranges: (0..6u32)
                .map(|i| [(0, i + 1), (0, 0)])
                .chain((1..=3u32).map(|j| [(0, 2), (6, 6 + j)]))
                .chain((1..=3u32).map(|j| [(0, 5), (9, 9 + j)]))
                .collect(),
            out: (0..12).collect(),
        };
        net.forward(&b).unwrap()
    };
    let labels: Vec<u32> = (0..12).map(|i| (i * 13) % vocab.len() as u32).collect();
    let l = paradraft::train::fused::cross_entropy_kl(&logits, &labels, None, 0.0)
        .unwrap()
        .sum_all()
        .unwrap();
    let g = l.backward().unwrap();
    common::assert_every_var_has_a_gradient(&net.vars, &g);
}

fn tree(ngram: bool, lm: &Loaded) -> TreeDrafting {
    let trie = ngram.then(|| {
        let mut b = paradraft::ngram::TrieBuilder::new(3).unwrap();
        b.add_document(
            &lm.tokenizer
                .encode("the quick brown fox jumps over the lazy dog")
                .unwrap(),
        );
        std::sync::Arc::new(b.finish(paradraft::ngram::stamp_of(&lm.tokenizer)).unwrap())
    });
    let stop = lm.tokenizer.stop_tokens.iter().copied().collect();
    TreeDrafting::new(TreeSearchParams::default(), trie, stop)
}

/// A quantized drafter from `dir` drafting trees (with the n-gram trie if `ngram`) for a
/// context of `ctx`.
fn tree_drafter<'t>(lm: &'t Loaded, dir: &std::path::Path, ctx: usize, ngram: bool) -> Dart<'t> {
    let (m, head) = DartModel::load(dir, true).unwrap();
    Dart::new(
        m,
        head,
        &lm.model,
        ctx,
        None,
        Selection::Tree(tree(ngram, lm)),
    )
    .unwrap()
}

#[test]
fn speculative_decoding_with_dart_is_lossless() {
    let lm = load_tiny("llama");
    let vocab = reduced(lm.model.config.vocab_size);
    let (dir, _) = drafter_dir(&lm, &vocab, 3, 1);
    let (dir2, _) = drafter_dir(&lm, &vocab, 3, 2);
    let prompt = lm
        .tokenizer
        .encode("the quick brown fox jumps over")
        .unwrap();
    let greedy = GenerateParams {
        max_new_tokens: 60,
        sampling: SamplingParams::default(),
        stop_strings: vec![],
        ..Default::default()
    };
    let mut kv = lm.model.new_kv(120);
    let ar = generate(&lm.model, &lm.tokenizer, &mut kv, &prompt, &greedy, |_| {}).unwrap();
    // (n-gram trie, budget, masks, a sampled chain instead of the tree: its argmax at T = 0,
    // a tree learning its depth, two layers)
    for (ngram, budget, masks, chain, learn, deep) in [
        (false, 8, None, false, false, false),
        (true, 24, Some(2), false, false, false),
        (true, 1, None, false, false, false),
        (false, 8, None, true, false, false),
        (false, 8, None, false, true, false),
        (true, 24, None, false, false, true),
        (false, 8, None, true, false, true),
    ] {
        let (m, head) = DartModel::load(if deep { &dir2 } else { &dir }.path(), true).unwrap();
        let selection = if chain {
            Selection::Sample
        } else {
            Selection::Tree(tree(ngram, &lm))
        };
        let mut d = Dart::new(m, head, &lm.model, 120, masks, selection).unwrap();
        if learn {
            d = d.learning_depth();
            assert_eq!(d.depths(), MASKS + 1, "untried depths are drafted");
        }
        let sp = speculative_generate(
            &lm.model,
            &lm.tokenizer,
            &mut kv,
            &prompt,
            &greedy,
            Speculation {
                drafter: Box::new(&mut d),
                max_draft: budget,
                sizer: None,
                rule: Default::default(),
            },
            |_| {},
        )
        .unwrap();
        assert_eq!(
            sp.out.token_ids, ar.token_ids,
            "ngram={ngram} budget={budget} chain={chain} learn={learn} deep={deep}"
        );
        assert!(sp.rounds.iter().all(|r| r.drafted <= budget));
        if learn {
            // The untrained drafter's nodes are rarely accepted: it ends at one depth.
            let accepted: usize = sp.rounds.iter().map(|r| r.accepted).sum();
            assert!(accepted * 4 < sp.rounds.len(), "{accepted} accepted");
            assert_eq!(d.depths(), 1);
        }
    }
}

/// A prompt longer than the positions a drafter keeps pending until its first proposal: the
/// rest pass its layer when the request starts, and the first proposal feeds the others
/// (the cache and the pending states meet at the root; a gap would be refused).
#[test]
fn a_long_prompt_is_passed_in_two_parts_and_stays_lossless() {
    let lm = load_tiny("llama");
    let vocab = reduced(lm.model.config.vocab_size);
    let (dir, _) = drafter_dir(&lm, &vocab, 3, 1);
    let text = "the quick brown fox jumps over the lazy dog. ".repeat(40);
    let prompt = lm.tokenizer.encode(&text).unwrap();
    assert!(prompt.len() > 300, "{} prompt tokens", prompt.len());
    let ctx = prompt.len() + 64;
    let greedy = GenerateParams {
        max_new_tokens: 40,
        sampling: SamplingParams::default(),
        stop_strings: vec![],
        ..Default::default()
    };
    let mut kv = lm.model.new_kv(ctx);
    let ar = generate(&lm.model, &lm.tokenizer, &mut kv, &prompt, &greedy, |_| {}).unwrap();
    let mut d = tree_drafter(&lm, dir.path(), ctx, true);
    let sp = speculative_generate(
        &lm.model,
        &lm.tokenizer,
        &mut kv,
        &prompt,
        &greedy,
        Speculation {
            drafter: Box::new(&mut d),
            max_draft: 8,
            sizer: None,
            rule: Default::default(),
        },
        |_| {},
    )
    .unwrap();
    assert_eq!(sp.out.token_ids, ar.token_ids);
    assert!(
        sp.rounds.iter().all(|r| r.drafted > 0),
        "every round drafted"
    );

    // In a batch the waiting positions are fed by the first proposal itself: it drafts what
    // a drafter alone drafts after passing them first.
    use paradraft::speculative::{BatchPrice, Drafter, Hidden};
    let w = 3 * lm.model.config.hidden_size;
    let feats = pseudo_random(prompt.len() * w, 9);
    let mut committed = prompt.clone();
    committed.push(TokenId(42));
    let mut trees = vec![];
    for streams in [1, 4] {
        let mut d = tree_drafter(&lm, dir.path(), ctx, true);
        d.begin(
            &prompt,
            Hidden {
                width: w,
                rows: &feats,
            },
        )
        .unwrap();
        d.batch(BatchPrice {
            streams,
            ..Default::default()
        });
        let t = d.propose(&committed, 8).unwrap();
        assert!(!t.is_empty());
        trees.push(common::tree_tokens(&t));
    }
    assert_eq!(trees[0], trees[1]);
}

/// Rounds that ask for no node (held drafting, or `auto` not asking its model) let the
/// target states pile up only so far: past twice the lazy prompt rows they are passed in one
/// chunk, and the next proposal drafts what it would have drafted from all of them at once.
#[test]
fn held_rounds_keep_pending_states_bounded() {
    use paradraft::speculative::{Drafter, Hidden};
    let lm = load_tiny("llama");
    let vocab = reduced(lm.model.config.vocab_size);
    let (dir, _) = drafter_dir(&lm, &vocab, 3, 1);
    let w = 3 * lm.model.config.hidden_size;
    let prompt: Vec<TokenId> = (0..12).map(|i| TokenId(20 + i * 5)).collect();
    let (n, rounds) = (prompt.len(), 700);
    let feats = pseudo_random((n + rounds) * w, 4);
    let drafter = || {
        let mut d = tree_drafter(&lm, dir.path(), 1024, false);
        d.begin(
            &prompt,
            Hidden {
                width: w,
                rows: &feats[..n * w],
            },
        )
        .unwrap();
        d
    };
    let mut committed = prompt.clone();
    committed.push(TokenId(7));
    let mut held = drafter();
    let most = common::undrafted_rounds(&mut held, &mut committed, &feats, w, n, rounds, |d| {
        d.pending_positions()
    });
    assert!(most <= 2 * 256 + 1, "{most} pending positions");
    // What a server counts for them covers them.
    use paradraft::drafters::registry::Template;
    assert!(most * w * 4 <= Template::pending_bytes(&held, 1024));
    // The same rounds without asking: every state waits for the proposal.
    let mut late = drafter();
    let mut observed = prompt.clone();
    observed.push(TokenId(7));
    let none = paradraft::speculative::Outcome {
        accepted: vec![],
        tokens: vec![],
        bonus: TokenId(0),
        drafted: 0,
        top: Default::default(),
    };
    for r in 0..rounds {
        let rows = &feats[(n + r) * w..(n + r + 1) * w];
        late.observe(&none, Hidden { width: w, rows }).unwrap();
        observed.push(committed[n + 1 + r]);
    }
    assert_eq!(late.pending_positions(), n + rounds, "the prompt waits too");
    let t = held.propose(&committed, 8).unwrap();
    assert!(!t.is_empty());
    assert_eq!(
        common::tree_tokens(&t),
        common::tree_tokens(&late.propose(&observed, 8).unwrap())
    );
}

#[test]
fn drafters_that_do_not_fit_are_refused() {
    let lm = load_tiny("llama");
    let vocab = reduced(lm.model.config.vocab_size);
    // Wider taps than the target's hidden size.
    let mut cfg = tiny_config(&lm, &vocab, 1);
    cfg.target_hidden_size += 8;
    let net = Net::init(cfg, 1, None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    export(&net, &vocab, dir.path(), candle_core::DType::F16).unwrap();
    let (m, head) = DartModel::load(dir.path(), true).unwrap();
    let e = Dart::new(m, head, &lm.model, 64, None, tree(false, &lm))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("does not fit"), "{e}");
    // A corrupt d2t, a missing tensor, a config that is not DART's.
    let (good, _) = drafter_dir(&lm, &vocab, 1, 1);
    let cfg_path = good.path().join("config.json");
    let text = std::fs::read_to_string(&cfg_path).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    // The error a drafter with config `v` is refused with.
    let refused = |v: &serde_json::Value| {
        std::fs::write(&cfg_path, v.to_string()).unwrap();
        DartModel::load(good.path(), true)
            .err()
            .expect("refused")
            .to_string()
    };
    v["draft_vocab_size"] = serde_json::json!(vocab.len() - 1);
    let e = refused(&v);
    assert!(e.contains("d2t"), "{e}");
    v["draft_vocab_size"] = serde_json::json!(vocab.len());
    for layers in [0, 9] {
        v["num_hidden_layers"] = serde_json::json!(layers);
        let e = refused(&v);
        assert!(e.contains("1 to 8 layers"), "{e}");
    }
    // Two layers claimed, one stored: the missing layer is named.
    v["num_hidden_layers"] = serde_json::json!(2);
    let e = refused(&v);
    assert!(e.contains("layers.1."), "{e}");
    std::fs::write(&cfg_path, "{not json").unwrap();
    assert!(DartModel::load(good.path(), true).is_err());
    assert!(DartModel::load(&good.path().join("nope"), true).is_err());
    assert_eq!(dart_taps(30).unwrap(), vec![1, 14, 26]);
    assert_eq!(dart_taps(36).unwrap(), vec![1, 17, 32]);
}

/// The committed SmolLM2 DART drafter: token-identical to AR greedy with fixed trees and with
/// trees cut by the sizer, and it commits more than one token per pass.
#[test]
fn committed_smollm2_dart_drafter_is_lossless_and_accepts_drafts() {
    use paradraft::speculative::sizing::{CostCurve, Sizer};
    let (lm, trie, prompts) = common::smollm2_with_trie_and_prompts();
    let drafter = common::committed_drafter("smollm2-135m-dart");
    let params = GenerateParams {
        max_new_tokens: 48,
        sampling: SamplingParams::default(),
        stop_strings: vec![],
        ..Default::default()
    };
    let curve = CostCurve::measure(&lm.model, 64, 2).unwrap();
    let (mut rounds, mut committed) = (0usize, 0usize);
    for (id, prompt) in &prompts {
        let mut kv = lm.model.new_kv(1024);
        let ar = generate(&lm.model, &lm.tokenizer, &mut kv, prompt, &params, |_| {}).unwrap();
        for sized in [false, true] {
            let (m, head) = DartModel::load(&drafter, true).unwrap();
            let stop = lm.tokenizer.stop_tokens.iter().copied().collect();
            let td = TreeDrafting::new(TreeSearchParams::default(), Some(trie.clone()), stop);
            let mut d = Dart::new(m, head, &lm.model, 1024, None, td).unwrap();
            let sizer = Sizer::new(curve.clone());
            let sp = speculative_generate(
                &lm.model,
                &lm.tokenizer,
                &mut kv,
                prompt,
                &params,
                Speculation {
                    drafter: Box::new(&mut d),
                    max_draft: 24,
                    sizer: sized.then(|| sizer.clone()),
                    rule: Default::default(),
                },
                |_| {},
            )
            .unwrap();
            assert_eq!(sp.out.token_ids, ar.token_ids, "{id} sized={sized}");
            if !sized {
                rounds += sp.rounds.len();
                committed += sp.rounds.iter().map(|r| r.accepted + 1).sum::<usize>();
            }
        }
    }
    let tau = committed as f64 / rounds as f64;
    eprintln!("DART τ with 24-node trees: {tau:.3}");
    assert!(tau > 1.5, "τ {tau:.3}");
}

/// Batched drafting: the calls of three requests' drafters (different prompts, one asked for
/// no node in a round) queued in one shared pass draft, round after round, exactly what each
/// drafts alone — trees and node confidences — and the pass is one for all of them.
#[test]
fn a_batched_pass_drafts_what_each_call_drafts_alone() {
    use paradraft::speculative::{Drafter, Hidden, Outcome};
    let lm = load_tiny("llama");
    let vocab = reduced(lm.model.config.vocab_size);
    let (dir, _) = drafter_dir(&lm, &vocab, 5, 1);
    let w = 3 * lm.model.config.hidden_size;
    let prompts: Vec<Vec<TokenId>> = [7usize, 12, 20]
        .iter()
        .map(|&n| {
            (0..n as u32)
                .map(|i| TokenId(10 + (i * 7 + n as u32) % 50))
                .collect()
        })
        .collect();
    let rounds = 4;
    let feats: Vec<Vec<f32>> = prompts
        .iter()
        .enumerate()
        .map(|(k, p)| pseudo_random((p.len() + rounds * 10) * w, 9 + k as u32))
        .collect();
    let set = || -> Vec<Dart> {
        let template = tree_drafter(&lm, dir.path(), 256, true);
        let mut ds: Vec<Dart> = (0..prompts.len())
            .map(|_| template.fork(256, SamplingParams::default()).unwrap())
            .collect();
        for (k, d) in ds.iter_mut().enumerate() {
            let n = prompts[k].len();
            let rows = &feats[k][..n * w];
            d.begin(&prompts[k], Hidden { width: w, rows }).unwrap();
        }
        ds
    };
    let (mut alone, mut batched) = (set(), set());
    let mut committed: Vec<Vec<TokenId>> = prompts
        .iter()
        .map(|p| [p.as_slice(), &[TokenId(3)]].concat())
        .collect();
    let mut accepted_nodes = 0;
    for r in 0..rounds {
        // Request 1 is asked for nothing in round 1 (held): it queues no call.
        let ask = |k: usize| if r == 1 && k == 1 { 0 } else { 8 };
        let mut passes = vec![];
        for (k, d) in batched.iter_mut().enumerate() {
            match d.prepare(&committed[k], ask(k)).unwrap() {
                Some(p) => passes.push(p),
                None => assert_eq!(ask(k), 0, "round {r}: request {k} queued no call"),
            }
        }
        assert!(passes.iter().all(|p| p.same(&passes[0])), "one pass");
        passes[0].run(&lm.model);
        for k in 0..prompts.len() {
            let a = alone[k].propose(&committed[k], ask(k)).unwrap();
            let b = batched[k].propose(&committed[k], ask(k)).unwrap();
            let what = format!("round {r}, request {k}");
            assert_eq!(common::tree_tokens(&a), common::tree_tokens(&b), "{what}");
            let parents = |t: &paradraft::speculative::DraftTree| {
                (0..t.len() as u32)
                    .map(|i| t.parent(paradraft::speculative::NodeId(i)))
                    .collect::<Vec<_>>()
            };
            assert_eq!(parents(&a), parents(&b), "{what}");
            let bits = |d: &Dart| {
                d.node_confidence()
                    .map(|c| c.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
            };
            assert_eq!(bits(&alone[k]), bits(&batched[k]), "{what}");
            // A queued call's share of the pass is its drafting time; alone there is none.
            assert_eq!(alone[k].shared_ms(), 0.0, "{what}");
            assert_eq!(batched[k].shared_ms() > 0.0, ask(k) > 0, "{what}");
            // The target accepts the first node when there is one; its states come next.
            let accepted: Vec<_> = (!a.is_empty())
                .then_some(paradraft::speculative::NodeId(0))
                .into_iter()
                .collect();
            let tokens: Vec<TokenId> = accepted.iter().map(|&n| a.token(n)).collect();
            let out = Outcome {
                accepted,
                tokens: tokens.clone(),
                bonus: TokenId(4 + r as u32),
                drafted: a.len(),
                top: Default::default(),
            };
            let n = committed[k].len() - 1;
            let rows = &feats[k][n * w..(n + 1 + tokens.len()) * w];
            for d in [&mut alone[k], &mut batched[k]] {
                d.observe(&out, Hidden { width: w, rows }).unwrap();
            }
            accepted_nodes += tokens.len();
            committed[k].extend_from_slice(&tokens);
            committed[k].push(out.bonus);
        }
    }
    assert!(accepted_nodes >= 8, "{accepted_nodes} rounds drafted");
}
