//! Shared helpers for the integration tests.
#![allow(dead_code)]

pub mod replay;
pub mod stepping;

use paradraft::model::{self, Batch, Loaded, Logits, Output, OutputSpec, Rows, Scratch};
use paradraft::types::{Pos, TokenId};
use std::path::PathBuf;

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

pub fn load_tiny(name: &str) -> Loaded {
    model::load(&fixtures().join("tiny").join(name)).expect("tiny model loads")
}

/// Reads an f32 or i64 tensor from a reference safetensors file as (shape, f64 values).
pub fn read_ref(path: &PathBuf, name: &str) -> (Vec<usize>, Vec<f64>) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    let vals = match t.dtype() {
        safetensors::Dtype::F32 => t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        safetensors::Dtype::I64 => t
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        d => panic!("unexpected dtype {d:?}"),
    };
    (t.shape().to_vec(), vals)
}

pub fn ids(v: &[f64]) -> Vec<TokenId> {
    v.iter().map(|&x| TokenId(x as u32)).collect()
}

pub fn seq_positions(start: usize, n: usize) -> Vec<Pos> {
    (start..start + n).map(|p| Pos(p as u32)).collect()
}

/// One causal forward over `tokens` from an empty cache.
pub fn run_forward(lm: &Loaded, tokens: &[TokenId], spec: &OutputSpec) -> Output {
    let mut kv = lm.model.new_kv(tokens.len() + 8);
    let mut s = Scratch::default();
    let pos = seq_positions(0, tokens.len());
    let batch = Batch {
        tokens,
        positions: &pos,
        mask: None,
    };
    lm.model
        .forward(&mut kv, &batch, spec, &mut s)
        .unwrap()
        .clone()
}

/// Full logits for every token of `tokens`, run as one causal forward from an empty cache.
pub fn run_logits(lm: &Loaded, tokens: &[TokenId]) -> Vec<Vec<f32>> {
    let out = run_forward(lm, tokens, &OutputSpec::all_full());
    (0..tokens.len())
        .map(|i| out.logits_row(i).to_vec())
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn spec_with_taps(taps: Vec<usize>) -> OutputSpec {
    OutputSpec {
        rows: Rows::All,
        logits: Logits::Full,
        taps,
    }
}

/// A small DFlash configuration for a tiny target (Qwen3 layers of its own shape).
pub fn tiny_dflash_config(
    target: &Loaded,
    layers: usize,
    taps: &[usize],
    block: usize,
) -> paradraft::drafters::dflash::DflashConfig {
    let t = &target.model.config;
    let mut c = t.clone();
    c.arch = model::Arch::Qwen3;
    c.n_layers = layers;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 16;
    c.intermediate_size = 96;
    c.rope_theta = 10000.0;
    c.rope_scaling = model::config::RopeScaling::None;
    c.rope_style = paradraft::runtime::ops::RopeStyle::Half;
    paradraft::drafters::dflash::DflashConfig {
        layers: c,
        block_size: block,
        num_target_layers: t.n_layers,
        mask_token_id: 5,
        target_layer_ids: taps.to_vec(),
        draft_vocab_size: None,
    }
}

/// An untrained DFlash drafter (seeded random weights, f16) written to a temporary directory;
/// `reduced` drops every third id from its vocabulary.
pub fn tiny_dflash_dir(
    lm: &Loaded,
    cfg: &paradraft::drafters::dflash::DflashConfig,
    reduced: bool,
) -> tempfile::TempDir {
    use paradraft::drafters::vocab::DraftVocab;
    let net = paradraft::train::dflash::net::Net::init(cfg.clone(), 11).unwrap();
    let n = lm.model.config.vocab_size;
    let vocab = if reduced {
        DraftVocab::from_d2t((0..n as u32).filter(|i| i % 3 != 1).collect(), n)
    } else {
        DraftVocab::full(n)
    };
    let dir = tempfile::tempdir().unwrap();
    paradraft::train::dflash::export(&net, &vocab, n, dir.path(), candle_core::DType::F16).unwrap();
    dir
}

/// An untrained DART drafter (seeded random weights, f32) for a tiny target in the published
/// layout, with `masks` mask slots and every third id dropped from its vocabulary.
pub fn tiny_dart_dir(lm: &Loaded, masks: usize, seed: u64) -> tempfile::TempDir {
    use paradraft::drafters::vocab::DraftVocab;
    let n = lm.model.config.vocab_size;
    let vocab = DraftVocab::from_d2t((0..n as u32).filter(|i| i % 3 != 1).collect(), n);
    let mut c = paradraft::train::dart::config_for(&lm.model, masks, vocab.len());
    c.layer.n_heads = 4;
    c.layer.n_kv_heads = 2;
    c.layer.head_dim = 16;
    c.layer.intermediate_size = 96;
    let net = paradraft::train::dart::net::Net::init(c, seed, None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    paradraft::train::dart::export(&net, &vocab, dir.path(), candle_core::DType::F32).unwrap();
    dir
}

/// Benchmark prompts as (item id, chat-templated token ids).
pub type Prompts = Vec<(String, Vec<TokenId>)>;

/// SmolLM2 (fetched on first use), the order-3 trie of the vendored permissive corpus (no
/// benchmark answers in it), and chat-templated prompts of 2 GSM8K and 1 HumanEval items.
pub fn smollm2_with_trie_and_prompts(
) -> (Loaded, std::sync::Arc<paradraft::ngram::NgramTrie>, Prompts) {
    use paradraft::bench::datasets::{default_dir, Dataset};
    let path = paradraft::fetch::ensure_default_model().unwrap();
    let lm = model::load(&path).unwrap();
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/corpus/corpus_permissive.jsonl.gz");
    let trie = std::sync::Arc::new(
        paradraft::ngram::build_from_jsonl(&[corpus], &lm.tokenizer, 3, 2, |_, _| {}).unwrap(),
    );
    let data = default_dir();
    let mut items = Dataset::Gsm8k.load(&data, 2).unwrap();
    items.extend(Dataset::HumanEval.load(&data, 1).unwrap());
    let prompts = items
        .iter()
        .map(|it| {
            let text = lm
                .tokenizer
                .apply_chat_template(&[model::Message::new("user", &it.turns[0])], true)
                .unwrap();
            (it.id.clone(), lm.tokenizer.encode(&text).unwrap())
        })
        .collect();
    (lm, trie, prompts)
}

/// A committed drafter of the repository (`drafters/NAME`).
pub fn committed_drafter(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../drafters")
        .join(name)
}

/// Every variable of `vars` has a non-zero, finite gradient in `grads`.
pub fn assert_every_var_has_a_gradient(
    vars: &std::collections::BTreeMap<String, candle_core::Var>,
    grads: &candle_core::backprop::GradStore,
) {
    for (name, v) in vars {
        let gr = grads
            .get(v.as_tensor())
            .unwrap_or_else(|| panic!("{name} gets no gradient"));
        let s = gr
            .abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(s > 0.0 && s.is_finite(), "{name}: gradient sum {s}");
    }
}

/// The target's first `layers` layers as a PARD drafter (weights perturbed by seeded noise so
/// that tests do not pass on the target's own numbers), exported in the compact layout (K 4,
/// mask `mask`) in f32, with its training network.
pub fn tiny_pard_dir(
    lm: &Loaded,
    layers: usize,
    vocab: &paradraft::drafters::vocab::DraftVocab,
    mask: u32,
) -> (tempfile::TempDir, paradraft::train::pard::net::Net) {
    let cod = paradraft::train::pard::Cod {
        k: 4,
        ..Default::default()
    };
    tiny_mask_dir(lm, layers, vocab, mask, &cod)
}

/// [`tiny_pard_dir`] for any mask-token objective (`obj` writes its config keys: a DiffuSpec
/// drafter with `train::dlm::Diffusion`).
pub fn tiny_mask_dir(
    lm: &Loaded,
    layers: usize,
    vocab: &paradraft::drafters::vocab::DraftVocab,
    mask: u32,
    obj: &dyn paradraft::train::pard::Objective,
) -> (tempfile::TempDir, paradraft::train::pard::net::Net) {
    use paradraft::train::pard::{config_for, export, net::Net};
    let net = Net::from_target(config_for(&lm.model, layers).unwrap(), &lm.model).unwrap();
    let mut state = 0x2545_f491_u32;
    for v in net.vars.values() {
        let t = v.as_tensor();
        let noise: Vec<f32> = (0..t.elem_count())
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((state >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 0.04
            })
            .collect();
        let n = candle_core::Tensor::from_vec(noise, t.shape(), t.device()).unwrap();
        v.set(&(t + n).unwrap()).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    export(
        &net,
        TokenId(mask),
        obj,
        vocab,
        dir.path(),
        candle_core::DType::F32,
    )
    .unwrap();
    (dir, net)
}

/// Speculative decoding of `prompt` with `drafter` (at most `max_draft` per round, no sizer,
/// the default verify rule).
pub fn speculate<'a>(
    lm: &'a Loaded,
    kv: &mut paradraft::kv::KvCache,
    prompt: &[TokenId],
    params: &paradraft::generate::GenerateParams,
    drafter: Box<dyn paradraft::speculative::Drafter + 'a>,
    max_draft: usize,
) -> paradraft::speculative::SpecGeneration {
    let sp = paradraft::speculative::Speculation {
        drafter,
        max_draft,
        sizer: None,
        rule: Default::default(),
    };
    paradraft::speculative::speculative_generate(
        &lm.model,
        &lm.tokenizer,
        kv,
        prompt,
        params,
        sp,
        |_| {},
    )
    .unwrap()
}

/// A mask-token drafter's training-graph logits over the draft vocabulary at `rows` of
/// layout `l`, flattened.
pub fn graph_logits(
    lm: &Loaded,
    net: &paradraft::train::pard::net::Net,
    vocab: &paradraft::drafters::vocab::DraftVocab,
    l: paradraft::train::pard::Layout,
    rows: Vec<u32>,
) -> Vec<f32> {
    let mut lb = paradraft::train::pard::embed(&lm.model, l)
        .unwrap()
        .unwrap();
    lb.batch.out = rows;
    let head = paradraft::train::dflash::frozen_head(&lm.model, vocab).unwrap();
    head.forward(&net.forward(&lb.batch).unwrap())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// The training graph's block for one drafting pass of `k` after the last of `tokens`
/// (`obj`'s evaluation layout: the root's row, then the block's).
pub fn mask_graph_block(
    lm: &Loaded,
    net: &paradraft::train::pard::net::Net,
    vocab: &paradraft::drafters::vocab::DraftVocab,
    obj: &dyn paradraft::train::pard::Objective,
    tokens: &[TokenId],
    k: usize,
    mask: u32,
) -> Vec<f32> {
    let (l, rows) = obj.eval_layout(tokens, &[tokens.len() - 1], k, TokenId(mask), vocab);
    graph_logits(lm, net, vocab, l, rows)
}

/// A drafter's block (`block`: its logits and row width) equals `graph`'s to 1e-4 over three
/// rounds with two tokens committed between them, and after a rewind of three tokens (the
/// cache re-runs what it no longer agrees on). Returns the rewound tokens and their block.
pub fn assert_rounds_match_graph<D: paradraft::speculative::Drafter>(
    d: &mut D,
    block: fn(&D) -> (&[f32], usize),
    graph: impl Fn(&[TokenId]) -> Vec<f32>,
    mut toks: Vec<TokenId>,
    k: usize,
    vocab_len: usize,
) -> (Vec<TokenId>, Vec<f32>) {
    let hidden = paradraft::speculative::Hidden {
        width: 0,
        rows: &[],
    };
    d.begin(&toks, hidden).unwrap();
    for round in 0..3 {
        let tree = d.propose(&toks, k).unwrap();
        assert_eq!(tree.len(), k, "round {round}");
        let (rt, v) = block(d);
        assert_eq!(v, vocab_len);
        let want = graph(&toks);
        let diff = max_abs_diff(rt, &want);
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(
            scale > 0.1 && diff < 1e-4,
            "round {round}: |Δ| {diff} at scale {scale}"
        );
        toks.extend([TokenId(40 + round as u32), TokenId(7)]);
    }
    toks.truncate(toks.len() - 3);
    d.propose(&toks, k).unwrap();
    let want = graph(&toks);
    assert!(max_abs_diff(block(d).0, &want) < 1e-4);
    (toks, want)
}

/// The mask-token objective's loss (one cross-entropy mean over `lb`'s labels, scored with the
/// target's frozen head) gives every trainable tensor of `net` a gradient.
pub fn assert_mask_loss_reaches_every_var(
    lm: &Loaded,
    net: &paradraft::train::pard::net::Net,
    vocab: &paradraft::drafters::vocab::DraftVocab,
    lb: &paradraft::train::pard::Labeled,
) {
    let head = paradraft::train::dflash::frozen_head(&lm.model, vocab).unwrap();
    let logits = head.forward(&net.forward(&lb.batch).unwrap()).unwrap();
    let loss = paradraft::train::fused::cross_entropy_kl(&logits, &lb.labels, None, 0.0)
        .unwrap()
        .mean_all()
        .unwrap();
    let grads = loss.backward().unwrap();
    assert_every_var_has_a_gradient(&net.vars, &grads);
}

/// A draft tree's tokens in node order.
pub fn tree_tokens(t: &paradraft::speculative::DraftTree) -> Vec<TokenId> {
    (0..t.len())
        .map(|i| t.token(paradraft::speculative::NodeId(i as u32)))
        .collect()
}

/// Runs `rounds` rounds that verified no node through drafter `d` (begun on `committed`
/// minus its root), each first asking it for no node (held drafting) and then observing one
/// row of target states from `feats` (rows after the `from`th) with a bonus token that joins
/// `committed`. Returns the most positions `pending` reported after a round.
pub fn undrafted_rounds<D: paradraft::speculative::Drafter>(
    d: &mut D,
    committed: &mut Vec<TokenId>,
    feats: &[f32],
    width: usize,
    from: usize,
    rounds: usize,
    pending: impl Fn(&D) -> usize,
) -> usize {
    use paradraft::speculative::{Hidden, Outcome};
    let mut most = 0;
    for r in 0..rounds {
        assert!(d.propose(committed, 0).unwrap().is_empty());
        let bonus = TokenId(30 + (r as u32 * 13) % 200);
        let outcome = Outcome {
            accepted: vec![],
            tokens: vec![],
            bonus,
            drafted: 0,
            top: Default::default(),
        };
        let rows = &feats[(from + r) * width..(from + r + 1) * width];
        d.observe(&outcome, Hidden { width, rows }).unwrap();
        most = most.max(pending(d));
        committed.push(bonus);
    }
    most
}
