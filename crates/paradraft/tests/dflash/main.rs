//! DFlash: the training graph and the inference runtime compute the same network (KV
//! injection, block attention, packing of several anchors), every trainable tensor receives a
//! gradient, speculative decoding with a DFlash drafter is lossless, and drafters that do not
//! fit their target are refused.

#[path = "../common/mod.rs"]
mod common;

use candle_core::{DType, Device, Tensor};
use common::load_tiny;
use paradraft::drafters::dflash::{Dflash, DflashConfig, DflashModel};
use paradraft::drafters::parts::{BlockDrafter, Selection};
use paradraft::drafters::vocab::DraftVocab;
use paradraft::generate::{generate, GenerateParams};
use paradraft::kv::KvCache;
use paradraft::model::{Loaded, Logits, OutputSpec, Rows};
use paradraft::sample::SamplingParams;
use paradraft::speculative::{speculative_generate, Speculation};
use paradraft::train::dflash::batch::Labeled;
use paradraft::train::dflash::net::{self, FrozenHead, Net};
use paradraft::train::dflash::{export, frozen_head, loss};
use paradraft::types::{Pos, TokenId};

const TAPS: [usize; 2] = [0, 2];
const BLOCK: usize = 6;

fn config(target: &Loaded, layers: usize) -> DflashConfig {
    common::tiny_dflash_config(target, layers, &TAPS, BLOCK)
}

/// Target features (the taps) of every position of `tokens`.
fn features(lm: &Loaded, tokens: &[TokenId]) -> Vec<f32> {
    let spec = OutputSpec {
        rows: Rows::Last,
        logits: Logits::None,
        taps: TAPS.to_vec(),
    };
    common::run_forward(lm, tokens, &spec).hidden
}

fn tokens(n: usize, vocab: usize) -> Vec<TokenId> {
    (0..n)
        .map(|i| TokenId(((i * 37 + 11) % (vocab - 20) + 10) as u32))
        .collect()
}

/// A packed training batch with one block per anchor, context 0..max(anchor).
fn packed(
    lm: &Loaded,
    toks: &[TokenId],
    feats: &[f32],
    anchors: &[usize],
    mask: TokenId,
) -> net::Batch {
    let h = lm.model.config.hidden_size;
    let width = TAPS.len() * h;
    let last = *anchors.iter().max().unwrap();
    let mut x = vec![0f32; anchors.len() * BLOCK * h];
    let mut block_pos = vec![];
    for (j, &a) in anchors.iter().enumerate() {
        for k in 0..BLOCK {
            let r = j * BLOCK + k;
            let id = if k == 0 { toks[a] } else { mask };
            lm.model.embed_row(id.idx(), &mut x[r * h..(r + 1) * h]);
            block_pos.push((a + k) as u32);
        }
    }
    let dev = &Device::Cpu;
    net::Batch {
        features: Tensor::from_vec(feats[..last * width].to_vec(), (last, width), dev).unwrap(),
        ctx_pos: (0..last as u32).collect(),
        block_x: Tensor::from_vec(x, (anchors.len() * BLOCK, h), dev).unwrap(),
        block_pos,
        n_blocks: anchors.len(),
        block: BLOCK,
    }
}

/// [`packed`] with labels slot k → token a + k, weighted exp(−(k − 1)/γ).
fn labeled(
    lm: &Loaded,
    toks: &[TokenId],
    feats: &[f32],
    anchors: &[usize],
    mask: TokenId,
    gamma: f32,
) -> Labeled {
    let mut labels = vec![];
    let mut weights = vec![];
    for &a in anchors {
        for k in 1..BLOCK {
            labels.push(toks[a + k].0);
            weights.push((-((k - 1) as f32) / gamma).exp());
        }
    }
    let n = labels.len();
    Labeled {
        batches: vec![packed(lm, toks, feats, anchors, mask)],
        labels,
        weights,
        target_hidden: None,
        teacher: vec![false; n],
        text_tok: vec![u32::MAX; n],
    }
}

/// The runtime's hidden states for one block at anchor `a` (context 0..a injected first).
fn runtime_block(
    lm: &Loaded,
    m: &DflashModel,
    toks: &[TokenId],
    feats: &[f32],
    a: usize,
) -> Vec<f32> {
    let h = lm.model.config.hidden_size;
    let width = TAPS.len() * h;
    let mut kv: KvCache = m.new_kv(64);
    let mut s = paradraft::drafters::dflash::model::Scratch::default();
    // Inject in two pieces, as rounds do.
    let cut = a / 2;
    let pos: Vec<Pos> = (0..a as u32).map(Pos).collect();
    m.add_context(&mut kv, &feats[..cut * width], &pos[..cut], &mut s)
        .unwrap();
    m.add_context(&mut kv, &feats[cut * width..a * width], &pos[cut..], &mut s)
        .unwrap();
    let mut x = vec![0f32; BLOCK * h];
    lm.model.embed_row(toks[a].idx(), &mut x[..h]);
    for k in 1..BLOCK {
        lm.model
            .embed_row(m.config.mask_token_id as usize, &mut x[k * h..(k + 1) * h]);
    }
    let bpos: Vec<Pos> = (a..a + BLOCK).map(|p| Pos(p as u32)).collect();
    let mut out = vec![];
    m.block_forward(&mut kv, &x, &bpos, &mut s, &mut out)
        .unwrap();
    assert_eq!(kv.len(), a, "block K/V must not persist");
    out
}

fn drafter_dir(lm: &Loaded, reduced: bool) -> tempfile::TempDir {
    common::tiny_dflash_dir(lm, &config(lm, 2), reduced)
}

mod decoding;
mod training;
