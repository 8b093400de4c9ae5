//! Losslessness of speculative decoding. Greedy: token-identical to AR greedy on 210 benchmark
//! prompts × drafters (prompt lookup, random trees, chains that follow the true continuation) on
//! the tiny models, and on the real model for a sample. Sampling: AR's first token follows the
//! target's softmax (chi-square); under the coupled rule every drafter gives AR's own tokens for
//! every seed; under the rejection rule the distribution of the first emitted tokens matches AR
//! sampling (chi-square); T > 0 never degenerates into greedy.

#[path = "../common/mod.rs"]
mod common;
use common::replay::{random_tree, Lcg, Replay};
use common::*;
use paradraft::drafters::dflash::{Dflash, DflashModel};
use paradraft::drafters::draft_model::DraftModel;
use paradraft::drafters::parts::{BlockDrafter, Selection};
use paradraft::drafters::pld::PromptLookup;
use paradraft::drafters::speculative_config::{DrafterConfig, DrafterSet, Method};
use paradraft::generate::{generate, GenerateParams};
use paradraft::grammar::Grammar;
use paradraft::model::{self, Loaded, Message};
use paradraft::process::Processing;
use paradraft::sample::SamplingParams;
use paradraft::speculative::sizing::{CostCurve, Sizer};
use paradraft::speculative::{
    speculative_generate, DraftTree, Drafter, Hidden, Speculation, VerifyRule,
};
use paradraft::types::TokenId;

fn prompts() -> Vec<String> {
    let p = fixtures().join("../data/bench/lossless_prompts.jsonl");
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["prompt"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

fn encode(lm: &Loaded, text: &str, max_prompt: usize) -> Vec<TokenId> {
    let t = lm
        .tokenizer
        .apply_chat_template(&[Message::new("user", text)], true)
        .unwrap();
    let ids = lm.tokenizer.encode(&t).unwrap();
    // Keep the template's end (the assistant header) when cutting long prompts.
    if ids.len() > max_prompt {
        ids[ids.len() - max_prompt..].to_vec()
    } else {
        ids
    }
}

fn greedy(max_new: usize) -> GenerateParams {
    GenerateParams {
        max_new_tokens: max_new,
        sampling: SamplingParams::default(),
        stop_strings: vec![],
        ..Default::default()
    }
}

/// A self-speculative drafter: the model's first `layers` layers.
fn self_draft(
    path: &std::path::Path,
    lm: &Loaded,
    layers: usize,
    sampling: SamplingParams,
) -> DraftModel {
    let m = model::load_truncated(path, Some(layers)).unwrap().model;
    DraftModel::new(m, lm.model.config.vocab_size, 1024, 4, sampling).unwrap()
}

/// `auto` drafting from `sources` for requests of up to `ctx` tokens on `lm` (read from
/// `path`), its suffix cache small, with `extra` options (a trie, a drafter directory).
fn auto<'t>(
    path: &std::path::Path,
    lm: &'t Loaded,
    sources: &[&str],
    ctx: usize,
    extra: impl FnOnce(&mut DrafterConfig),
) -> DrafterSet<'t> {
    let mut cfg = DrafterConfig {
        method: Method::named("auto").unwrap(),
        sources: sources.iter().map(|s| s.to_string()).collect(),
        suffix_cache_tokens: 1 << 14,
        tree_budget: 16,
        ..Default::default()
    };
    extra(&mut cfg);
    cfg.load(path, lm, ctx).unwrap()
}

/// Runs this binary's forwards on the calling thread (call first in every test). The models
/// are tiny or the forwards short, so a 2-thread pool would mostly wait, and the tests share
/// the cores by running side by side instead.
fn one_thread() {
    paradraft::runtime::init_threads(1);
}

mod conformance;
mod greedy;
mod sampling;
mod state;
