//! DiffuSpec (docs/diffuspec.md): the fast-mode runtime (cached causal prefix, bidirectional block) and
//! the masked-diffusion training graph give the same block logits across rounds; every
//! trainable tensor gets a gradient from eq. 3's loss; speculative decoding with DiffuSpec
//! (fast and faithful, S = 1 and S > 1, with and without CPS) is token-identical to AR greedy;
//! Dream's checkpoint conventions load through the same path; bad drafters and n-gram models
//! are refused with the reason.

mod common;

use common::{fixtures, load_tiny};
use paradraft::drafters::diffuspec::{DiffuSpec, DlmMode};
use paradraft::drafters::mask_lm::{DlmAttention, MaskLm};
use paradraft::drafters::parts::{BlockDrafter, CpsDrafting, Selection};
use paradraft::drafters::speculative_config::{DrafterConfig, Method, Mode};
use paradraft::drafters::vocab::DraftVocab;
use paradraft::generate::{generate, GenerateParams};
use paradraft::model::Loaded;
use paradraft::ngram::arpa::ArpaBuilder;
use paradraft::speculative::{Drafter, Hidden};
use paradraft::train::dlm::Diffusion;
use paradraft::train::pard::net::Net;
use paradraft::train::pard::{embed, Objective};
use paradraft::types::TokenId;
use rand_core::SeedableRng;
use std::sync::Arc;

const MASK: u32 = 5;

fn reduced(n: usize) -> DraftVocab {
    DraftVocab::from_d2t((0..n as u32).filter(|i| i % 3 != 1).collect(), n)
}

fn objective(k: usize) -> Diffusion {
    Diffusion {
        k,
        ..Diffusion::default()
    }
}

fn drafter(lm: &Loaded, layers: usize, vocab: &DraftVocab, k: usize) -> (tempfile::TempDir, Net) {
    common::tiny_mask_dir(lm, layers, vocab, MASK, &objective(k))
}

fn prompt(lm: &Loaded, text: &str) -> Vec<TokenId> {
    lm.tokenizer.encode(text).unwrap()
}

fn no_hidden() -> Hidden<'static> {
    Hidden {
        width: 0,
        rows: &[],
    }
}

/// The training graph's block logits for `tokens` with one all-masked block of k after the
/// last token (the anchor's row, then block rows 1..k−1).
fn graph_block(
    lm: &Loaded,
    net: &Net,
    vocab: &DraftVocab,
    tokens: &[TokenId],
    k: usize,
) -> Vec<f32> {
    common::mask_graph_block(lm, net, vocab, &objective(k), tokens, k, MASK)
}

fn load(dir: &std::path::Path, lm: &Loaded, exact: bool) -> MaskLm {
    MaskLm::load_with(dir, &fixtures().join("tiny/qwen3"), lm, "DiffuSpec", !exact).unwrap()
}

#[test]
fn fast_mode_matches_the_training_graph_across_rounds() {
    let lm = load_tiny("qwen3");
    let vocab = reduced(lm.model.config.vocab_size);
    let k = 4;
    let (dir, net) = drafter(&lm, 2, &vocab, k);
    let m = load(dir.path(), &lm, true);
    assert_eq!(m.diffusion, Some((DlmAttention::Block, Some(k))));
    assert_eq!(m.mask, TokenId(MASK));
    let mut d = DiffuSpec::new(m, 128, k, 1, DlmMode::Auto, Default::default()).unwrap();
    assert_eq!(d.mode, DlmMode::Fast);
    let (toks, want) = common::assert_rounds_match_graph(
        &mut d,
        DiffuSpec::block_logits,
        |t| graph_block(&lm, &net, &vocab, t, k),
        prompt(&lm, "The sea was calm and the ships sailed on"),
        k,
        vocab.len(),
    );
    // The block is bidirectional: the graph's first mask row changes when a later slot holds
    // a clean token instead of the mask (a causal block would not see it).
    let n = toks.len();
    let mut l = paradraft::train::pard::Layout::real(&toks, &vocab);
    let mut ext = toks.clone();
    ext.extend([TokenId(9), TokenId(11), TokenId(13), TokenId(15)]);
    Diffusion::push_block(
        &mut l,
        &ext,
        n - 1,
        &[true, true, false, true],
        TokenId(MASK),
        &vocab,
    );
    let with_clean = common::graph_logits(&lm, &net, &vocab, l, vec![n as u32]);
    let v = vocab.len();
    assert!(common::max_abs_diff(&with_clean, &want[v..2 * v]) > 1e-3);
}

#[test]
fn every_trainable_tensor_gets_a_gradient() {
    let lm = load_tiny("qwen3");
    let vocab = DraftVocab::full(lm.model.config.vocab_size);
    let net = Net::from_target(
        paradraft::train::pard::config_for(&lm.model, 2).unwrap(),
        &lm.model,
    )
    .unwrap();
    let tokens = prompt(
        &lm,
        "A story about the sea and ships, told twice over the years.",
    );
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let l = Diffusion::default().layout(&tokens, TokenId(MASK), &vocab, &mut rng);
    assert!(l.out.iter().any(|o| o.2 > 1), "block labels present");
    let lb = embed(&lm.model, l).unwrap().unwrap();
    common::assert_mask_loss_reaches_every_var(&lm, &net, &vocab, &lb);
}

/// A 3-gram model of the prompt text, stamped with the tiny tokenizer.
fn tiny_arpa(lm: &Loaded) -> paradraft::ngram::arpa::ArpaLm {
    let mut b = ArpaBuilder::new();
    for t in [
        "The sea was calm and the ships sailed on.",
        "Tell me a story about the sea and the ships on it.",
    ] {
        b.add_document(&prompt(lm, t));
    }
    let mut m = b.finish().unwrap();
    m.stamp = Some(paradraft::ngram::stamp_of(&lm.tokenizer));
    m
}

fn cps(lm: &Loaded, with_ngram: bool) -> CpsDrafting {
    CpsDrafting {
        lattice: Default::default(),
        cps: Default::default(),
        ngram: with_ngram.then(|| Arc::new(tiny_arpa(lm))),
        stop: lm.tokenizer.stop_tokens.iter().copied().collect(),
    }
}

#[test]
fn greedy_decoding_is_token_identical_in_every_mode() {
    let lm = load_tiny("qwen3");
    let vocab = reduced(lm.model.config.vocab_size);
    let (dir, _) = drafter(&lm, 1, &vocab, 4);
    let model = Arc::new(load(dir.path(), &lm, false));
    let p = prompt(&lm, "Tell me a story about the sea and the ships on it.");
    let params = GenerateParams {
        max_new_tokens: 40,
        sampling: Default::default(),
        stop_strings: vec![],
        ..Default::default()
    };
    let mut kv = lm.model.new_kv(p.len() + 80);
    let ar = generate(&lm.model, &lm.tokenizer, &mut kv, &p, &params, |_| {}).unwrap();
    for mode in [DlmMode::Fast, DlmMode::Faithful] {
        for steps in [1, 3] {
            for with_cps in [None, Some(false), Some(true)] {
                let selection = match with_cps {
                    Some(ng) => Selection::Cps(cps(&lm, ng)),
                    None => Selection::Greedy,
                };
                let d = DiffuSpec::new(model.clone(), 256, 4, steps, mode, Default::default())
                    .unwrap()
                    .with_selection(selection);
                let sp = common::speculate(&lm, &mut kv, &p, &params, Box::new(d), 4);
                assert_eq!(
                    sp.out.token_ids, ar.token_ids,
                    "{mode:?}, S {steps}, CPS {with_cps:?}"
                );
                assert!(sp.rounds.len() < ar.token_ids.len() + 1);
            }
        }
    }
}

/// S > 1 fixes the most confident slots first and re-runs the block with them filled in: the
/// final logits of a slot fixed late differ from the one-pass logits; S = k fixes one slot per
/// step.
#[test]
fn refinement_steps_condition_on_fixed_slots() {
    let lm = load_tiny("qwen3");
    let vocab = reduced(lm.model.config.vocab_size);
    let (dir, _) = drafter(&lm, 2, &vocab, 4);
    let model = Arc::new(load(dir.path(), &lm, true));
    let toks = prompt(&lm, "The sea was calm and the ships sailed on");
    let run = |steps, mode| {
        let mut d = DiffuSpec::new(model.clone(), 128, 4, steps, mode, Default::default()).unwrap();
        d.begin(&toks, no_hidden()).unwrap();
        d.propose(&toks, 4).unwrap();
        d.block_logits().0.to_vec()
    };
    let v = vocab.len();
    for mode in [DlmMode::Fast, DlmMode::Faithful] {
        let (one, four) = (run(1, mode), run(4, mode));
        // Slot 1 comes from the root, which (fast) never sees the block.
        if mode == DlmMode::Fast {
            assert!(common::max_abs_diff(&one[..v], &four[..v]) < 1e-5);
        }
        assert!(
            common::max_abs_diff(&one, &four) > 1e-4,
            "{mode:?}: S = 4 re-ran nothing"
        );
    }
    // Faithful mode attends over the prefix bidirectionally: not the fast mode's numbers.
    assert!(common::max_abs_diff(&run(1, DlmMode::Fast), &run(1, DlmMode::Faithful)) > 1e-4);
    assert!(DiffuSpec::new(model.clone(), 128, 4, 5, DlmMode::Fast, Default::default()).is_err());
    assert!(DiffuSpec::new(model.clone(), 128, 4, 0, DlmMode::Fast, Default::default()).is_err());
}

/// Dream's conventions — `model_type: "Dream"` (Qwen2 layers with attention biases), the mask
/// id in `generation_config.json`, full attention — load through the same path and decode
/// losslessly in faithful mode; without a mask id the error says so.
#[test]
fn dream_checkpoints_load_and_decode_losslessly() {
    let lm = load_tiny("qwen2");
    let src = fixtures().join("tiny/qwen2");
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["model_type"] = "Dream".into();
    cfg["architectures"] = serde_json::json!(["DreamModel"]);
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    let target = src.clone();
    let load_err = || match MaskLm::load(dir.path(), &target, &lm, "DiffuSpec") {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted"),
    };
    let err = load_err();
    assert!(err.contains("no mask token id"), "{err}");
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"mask_token_id": "x"}"#,
    )
    .unwrap();
    let err = load_err();
    assert!(err.contains("not a token id"), "{err}");
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"mask_token_id": 6, "eos_token_id": 2}"#,
    )
    .unwrap();
    let m = MaskLm::load(dir.path(), &target, &lm, "DiffuSpec").unwrap();
    assert_eq!(m.mask, TokenId(6));
    assert_eq!(m.diffusion, Some((DlmAttention::Full, None)));
    assert!(!m.shares_target_embedding);
    let d = DiffuSpec::new(m, 256, 5, 1, DlmMode::Auto, Default::default()).unwrap();
    assert_eq!(d.mode, DlmMode::Faithful);
    let p = prompt(&lm, "Tell me a story about the sea.");
    let params = GenerateParams {
        max_new_tokens: 24,
        sampling: Default::default(),
        stop_strings: vec![],
        ..Default::default()
    };
    let mut kv = lm.model.new_kv(p.len() + 60);
    let ar = generate(&lm.model, &lm.tokenizer, &mut kv, &p, &params, |_| {}).unwrap();
    let sp = common::speculate(&lm, &mut kv, &p, &params, Box::new(d), 5);
    assert_eq!(sp.out.token_ids, ar.token_ids);
}

/// Bad input through the drafter config: a PARD (causal) drafter given as a DLM, an ARPA
/// model of another tokenizer, a missing default ARPA model, options of other methods.
#[test]
fn bad_drafters_and_ngram_models_are_refused_with_the_reason() {
    let lm = load_tiny("qwen3");
    let target = fixtures().join("tiny/qwen3");
    let vocab = reduced(lm.model.config.vocab_size);
    let (dlm, _) = drafter(&lm, 1, &vocab, 4);
    let (pard, _) = common::tiny_pard_dir(&lm, 1, &vocab, MASK);
    let cfg = |dir: &std::path::Path| DrafterConfig {
        method: Method::named("diffuspec").unwrap(),
        draft_model: Some(dir.to_path_buf()),
        num_speculative_tokens: 4,
        drafting: Some(Mode::Greedy),
        ..Default::default()
    };
    let err = |c: DrafterConfig| match c.load(&target, &lm, 128) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted"),
    };
    assert!(cfg(dlm.path()).load(&target, &lm, 128).is_ok());
    assert!(err(cfg(pard.path())).contains("not a diffusion drafter"));
    // An ARPA model stamped with another tokenizer.
    let mut m = tiny_arpa(&lm);
    let st = paradraft::ngram::stamp_of(&lm.tokenizer);
    m.stamp = Some(paradraft::ngram::TrieStamp {
        fingerprint: st.fingerprint ^ 1,
        ..st
    });
    let arpa = dlm.path().join("other.arpa");
    m.write(&arpa).unwrap();
    let e = err(DrafterConfig {
        drafting: None,
        ngram_arpa: Some(arpa.clone()),
        ..cfg(dlm.path())
    });
    assert!(e.contains("another tokenizer"), "{e}");
    // The same model stamped right is taken; --ngram-arpa with --no-cps is refused.
    tiny_arpa(&lm).write(&arpa).unwrap();
    let ok = DrafterConfig {
        drafting: None,
        ngram_arpa: Some(arpa.clone()),
        ..cfg(dlm.path())
    };
    assert!(ok.load(&target, &lm, 128).is_ok());
    assert!(err(DrafterConfig {
        ngram_arpa: Some(arpa),
        ..cfg(dlm.path())
    })
    .contains("--no-cps"));
    // DiffuSpec options on other methods; S beyond the block.
    let e = DrafterConfig {
        method: Method::named("pard").unwrap(),
        dlm_steps: 2,
        ..Default::default()
    }
    .check_used(&[Method::named("pard").unwrap()])
    .unwrap_err()
    .to_string();
    assert!(e.contains("--dlm-steps"), "{e}");
    assert!(err(DrafterConfig {
        dlm_steps: 9,
        ..cfg(dlm.path())
    })
    .contains("refinement steps"));
    // A tokenizer that is not the target's: one token of the vocabulary renamed.
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(target.join(f), dlm.path().join(f)).unwrap();
    }
    assert!(cfg(dlm.path()).load(&target, &lm, 128).is_ok());
    let tp = dlm.path().join("tokenizer.json");
    let mut t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&tp).unwrap()).unwrap();
    let v = t["model"]["vocab"].as_object_mut().unwrap();
    let id = v.remove("¤").unwrap();
    v.insert("¤¤".into(), id);
    std::fs::write(&tp, t.to_string()).unwrap();
    let e = err(cfg(dlm.path()));
    assert!(e.contains("tokenizer differs"), "{e}");
}
