//! PARD (docs/pard.md): the runtime (one pass over [committed, MASK × (K − 1)], mask entries
//! dropped from its cache) and the training graph give the same logits, also across rounds
//! that reuse the cache; every trainable tensor gets a gradient; speculative decoding with PARD
//! chains and trees is token-identical to AR greedy; bad drafters are refused with the reason
//! and a failed export leaves a good drafter as it was.

mod common;

use common::{fixtures, load_tiny};
use paradraft::drafters::mask_lm::MaskLm;
use paradraft::drafters::pard::Pard;
use paradraft::drafters::parts::{BlockDrafter, Selection};
use paradraft::drafters::vocab::DraftVocab;
use paradraft::generate::{generate, GenerateParams};
use paradraft::model::Loaded;
use paradraft::speculative::tree_search::TreeDrafting;
use paradraft::speculative::Drafter;
use paradraft::train::data::Sample;
use paradraft::train::pard::net::Net;
use paradraft::train::pard::{build, cod_chains, config_for, export, Cod, Data};
use paradraft::types::TokenId;
use rand_core::SeedableRng;

const MASK: u32 = 5;

fn reduced(n: usize) -> DraftVocab {
    DraftVocab::from_d2t((0..n as u32).filter(|i| i % 3 != 1).collect(), n)
}

fn drafter(lm: &Loaded, layers: usize, vocab: &DraftVocab) -> (tempfile::TempDir, Net) {
    common::tiny_pard_dir(lm, layers, vocab, MASK)
}

fn prompt(lm: &Loaded, text: &str) -> Vec<TokenId> {
    lm.tokenizer.encode(text).unwrap()
}

/// The block logits of the training graph for `tokens` with one chain of k − 1 masks after
/// the last token.
fn graph_block(
    lm: &Loaded,
    net: &Net,
    vocab: &DraftVocab,
    tokens: &[TokenId],
    k: usize,
) -> Vec<f32> {
    let cod = Cod {
        k,
        ..Cod::default()
    };
    common::mask_graph_block(lm, net, vocab, &cod, tokens, k, MASK)
}

#[test]
fn runtime_matches_the_training_graph_across_rounds() {
    let lm = load_tiny("qwen3");
    let vocab = reduced(lm.model.config.vocab_size);
    let (dir, net) = drafter(&lm, 2, &vocab);
    let m = MaskLm::load_with(
        dir.path(),
        &fixtures().join("tiny/qwen3"),
        &lm,
        "PARD",
        false,
    )
    .unwrap();
    assert!(m.shares_target_embedding);
    assert_eq!((m.mask, m.trained_k), (TokenId(MASK), Some(4)));
    let k = 4;
    let mut d = Pard::new(m, 128, k, Default::default()).unwrap();
    // Round 1; then two more tokens committed (the cache keeps the prefix, drops the masks).
    common::assert_rounds_match_graph(
        &mut d,
        Pard::block_logits,
        |t| graph_block(&lm, &net, &vocab, t, k),
        prompt(&lm, "The sea was calm and the ships sailed on"),
        k,
        vocab.len(),
    );
}

#[test]
fn every_trainable_tensor_gets_a_gradient() {
    let lm = load_tiny("qwen3");
    let vocab = DraftVocab::full(lm.model.config.vocab_size);
    let net = Net::from_target(config_for(&lm.model, 2).unwrap(), &lm.model).unwrap();
    let tokens = prompt(
        &lm,
        "A story about the sea and ships, told twice over the years.",
    );
    let samples = vec![Sample {
        prompt_index: 0,
        prompt_len: 2,
        tokens,
    }];
    let data = Data {
        target: &lm.model,
        samples: &samples,
        train: vec![0],
        vocab: &vocab,
        mask: TokenId(MASK),
        device: candle_core::Device::Cpu,
        max_seq: 512,
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let chains = cod_chains(samples[0].tokens.len(), &Cod::default(), &mut rng);
    let lb = build(&data, 0, &chains).unwrap().unwrap();
    common::assert_mask_loss_reaches_every_var(&lm, &net, &vocab, &lb);
}

#[test]
fn speculative_decoding_with_pard_is_lossless() {
    let lm = load_tiny("qwen3");
    let vocab = reduced(lm.model.config.vocab_size);
    let (dir, _) = drafter(&lm, 1, &vocab);
    let target = fixtures().join("tiny/qwen3");
    let params = GenerateParams {
        max_new_tokens: 40,
        sampling: Default::default(),
        stop_strings: vec![],
        ..Default::default()
    };
    let stop = lm.tokenizer.stop_tokens.iter().copied().collect::<Vec<_>>();
    for text in ["Tell me about the sea.", "1, 2, 3, 4,", "Once upon a time"] {
        let p = prompt(&lm, text);
        let mut kv = lm.model.new_kv(128);
        let ar = generate(&lm.model, &lm.tokenizer, &mut kv, &p, &params, |_| {})
            .unwrap()
            .token_ids;
        // DiffuSpec's path search over PARD's block, with a 3-gram proxy from the prompt.
        let arpa = {
            let mut b = paradraft::ngram::arpa::ArpaBuilder::new();
            b.add_document(&p);
            std::sync::Arc::new(b.finish().unwrap())
        };
        for (k, mode) in [
            (1, "chain"),
            (4, "chain"),
            (7, "chain"),
            (4, "tree"),
            (6, "cps"),
        ] {
            let m = MaskLm::load(dir.path(), &target, &lm, "PARD").unwrap();
            let mut max = k;
            let tree = mode == "tree";
            let selection = match mode {
                "tree" => {
                    max = 10;
                    Selection::Tree(TreeDrafting::new(Default::default(), None, stop.clone()))
                }
                "cps" => Selection::Cps(paradraft::drafters::parts::CpsDrafting {
                    lattice: Default::default(),
                    cps: Default::default(),
                    ngram: Some(arpa.clone()),
                    stop: stop.clone(),
                }),
                _ => Selection::Greedy,
            };
            let d = Pard::new(m, 128, k, Default::default())
                .unwrap()
                .with_selection(selection);
            assert_eq!(d.name(), if tree { "pard-tree" } else { "pard" });
            let mut kv = lm.model.new_kv(128);
            let got = common::speculate(&lm, &mut kv, &p, &params, Box::new(d), max);
            assert_eq!(got.out.token_ids, ar, "{text:?}, K {k}, {mode}");
        }
    }
}

#[test]
fn bad_drafters_are_refused_and_a_failed_export_keeps_the_good_one() {
    let lm = load_tiny("qwen3");
    let target = fixtures().join("tiny/qwen3");
    let vocab = reduced(lm.model.config.vocab_size);
    let (dir, net) = drafter(&lm, 1, &vocab);
    let cfg_path = dir.path().join("config.json");
    let good_cfg = std::fs::read_to_string(&cfg_path).unwrap();
    let err = |d: &std::path::Path| match MaskLm::load(d, &target, &lm, "PARD") {
        Ok(_) => panic!("{} loads", d.display()),
        Err(e) => e.to_string(),
    };
    let with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value = serde_json::from_str(&good_cfg).unwrap();
        f(&mut v);
        std::fs::write(&cfg_path, v.to_string()).unwrap();
    };
    with(&|v| {
        v.as_object_mut().unwrap().remove("pard_token");
    });
    assert!(
        err(dir.path()).contains("no mask token id"),
        "{}",
        err(dir.path())
    );
    with(&|v| v["pard_token"] = 100_000.into());
    assert!(err(dir.path()).contains("outside the vocabulary"));
    with(&|v| v["pard_token"] = "five".into());
    assert!(err(dir.path()).contains("not a token id"));
    // The engine-wide order: mask_token_id is read before pard_token.
    with(&|v| v["mask_token_id"] = 9.into());
    assert_eq!(
        MaskLm::load(dir.path(), &target, &lm, "PARD").unwrap().mask,
        TokenId(9)
    );
    with(&|v| v["vocab_size"] = 500.into());
    assert!(err(dir.path()).contains("does not fit the target"));
    with(&|v| v["hidden_size"] = 32.into());
    assert!(!err(dir.path()).is_empty());
    std::fs::write(&cfg_path, &good_cfg).unwrap();
    assert!(MaskLm::load(dir.path(), &target, &lm, "PARD").is_ok());
    // K = 0 or beyond the context.
    let m = || MaskLm::load(dir.path(), &target, &lm, "PARD").unwrap();
    assert!(Pard::new(m(), 64, 0, Default::default()).is_err());
    assert!(Pard::new(m(), 64, 64, Default::default()).is_err());
    // A failed export (an unsupported dtype) writes nothing over the good drafter.
    let st = dir.path().join("model.safetensors");
    let before = std::fs::read(&st).unwrap();
    assert!(export(
        &net,
        TokenId(MASK),
        &Cod {
            k: 4,
            ..Cod::default()
        },
        &vocab,
        dir.path(),
        candle_core::DType::U8
    )
    .is_err());
    assert_eq!(std::fs::read(&st).unwrap(), before);
    assert_eq!(std::fs::read_to_string(&cfg_path).unwrap(), good_cfg);
    // A truncated weights file.
    std::fs::write(&st, &before[..before.len() / 2]).unwrap();
    assert!(!err(dir.path()).is_empty());
    // Targets the trainer cannot make a drafter of say why.
    let llama = load_tiny("llama");
    let e = config_for(&llama.model, 1).unwrap_err().to_string();
    assert!(e.contains("RoPE scaling"), "{e}");
    assert!(config_for(&lm.model, 0).is_err() && config_for(&lm.model, 4).is_err());
}

/// A published PARD checkpoint is a plain HF causal-LM directory (its own embedding and head,
/// tokenizer files) plus `pard_token`: it loads unchanged, uses its own embedding, and decodes
/// losslessly; a drafter whose tokenizer differs from the target's is refused.
#[test]
fn a_published_layout_loads_unchanged() {
    let lm = load_tiny("qwen3");
    let src = fixtures().join("tiny/qwen3");
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    let cfg = dir.path().join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["pard_token"] = 7.into();
    v["spd_type"] = "pard".into();
    std::fs::write(&cfg, v.to_string()).unwrap();
    let m = MaskLm::load(dir.path(), &src, &lm, "PARD").unwrap();
    assert!(!m.shares_target_embedding);
    assert_eq!(
        (m.mask, m.vocab.len()),
        (TokenId(7), lm.model.config.vocab_size)
    );
    let p = prompt(&lm, "Tell me about the sea.");
    let params = GenerateParams {
        max_new_tokens: 24,
        sampling: Default::default(),
        stop_strings: vec![],
        ..Default::default()
    };
    let mut kv = lm.model.new_kv(128);
    let ar = generate(&lm.model, &lm.tokenizer, &mut kv, &p, &params, |_| {}).unwrap();
    let d = Pard::new(m, 128, 5, Default::default()).unwrap();
    let mut kv = lm.model.new_kv(128);
    let got = common::speculate(&lm, &mut kv, &p, &params, Box::new(d), 5);
    assert_eq!(got.out.token_ids, ar.token_ids);
    // The target itself as its own drafter: the masks aside, its drafts are the target's.
    assert!(got.tau > 1.0, "τ {}", got.tau);
    // Another tokenizer in the drafter directory: one token of the vocabulary renamed.
    let tp = dir.path().join("tokenizer.json");
    let mut t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&tp).unwrap()).unwrap();
    let vocab = t["model"]["vocab"].as_object_mut().unwrap();
    let id = vocab.remove("¤").unwrap();
    vocab.insert("¤¤".into(), id);
    std::fs::write(&tp, t.to_string()).unwrap();
    let e = MaskLm::load(dir.path(), &src, &lm, "PARD")
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("tokenizer"), "{e}");
}
