//! The method table's conformance suite (#62): every entry of [`METHODS`], in every drafting
//! mode it lists, loaded as `generate` loads it (its committed drafter, the default options) on
//! SmolLM2 and run as sessions stepped together in shared forwards (`speculative::step`), greedy
//! and sampled requests mixed: each session's output is its own AR output — token-identical at
//! T = 0, the coupled rule's seeded identity at T > 0 — whatever its neighbours draft. A new
//! table line is tested here without touching this file; `a_new_method_is_one_entry` runs a
//! method defined below through the same checks.

use super::*;
use paradraft::drafters::methods::METHODS;
use paradraft::drafters::registry::{LoadArgs, LoadedMethod, MethodEntry, Mode, Template};
use paradraft::error::Result;
use paradraft::speculative::{Outcome, Session};

/// Greedy, sampled and greedy requests (different prompts), each drafted by its own drafter
/// from `set`, stepped together; returns each request's output.
fn stepped(
    lm: &Loaded,
    set: &DrafterSet,
    prompts: &[Vec<TokenId>],
    params: &[GenerateParams],
) -> Vec<Vec<TokenId>> {
    let mut kvs: Vec<_> = prompts.iter().map(|_| lm.model.new_kv(512)).collect();
    let mut sessions: Vec<Session> = prompts
        .iter()
        .zip(kvs.iter_mut())
        .zip(params)
        .map(|((p, kv), params)| {
            let sp = set
                .speculation(params.sampling, VerifyRule::Coupled)
                .unwrap();
            Session::new(&lm.tokenizer, kv, p, params, sp, &lm.model.config).unwrap()
        })
        .collect();
    common::stepping::step_all(&lm.model, &mut kvs, &mut sessions, 64, |_| 0);
    sessions
        .into_iter()
        .map(|s| s.finish(&mut |_| {}).out.token_ids)
        .collect()
}

/// `entry` in each of its modes against AR on `lm` (loaded from `path`).
fn conform(entry: &'static MethodEntry, path: &std::path::Path, lm: &Loaded) {
    let ps = prompts();
    let prompts: Vec<Vec<TokenId>> = [3, 50, 101]
        .iter()
        .map(|&i| encode(lm, &ps[i], 128))
        .collect();
    let params: Vec<GenerateParams> = (0..prompts.len())
        .map(|i| GenerateParams {
            sampling: SamplingParams {
                temperature: if i == 1 { 0.9 } else { 0.0 },
                seed: 11 + i as u64,
                ..Default::default()
            },
            ..greedy(32)
        })
        .collect();
    let ar: Vec<Vec<TokenId>> = prompts
        .iter()
        .zip(&params)
        .map(|(p, params)| {
            let mut kv = lm.model.new_kv(512);
            generate(&lm.model, &lm.tokenizer, &mut kv, p, params, |_| {})
                .unwrap()
                .token_ids
        })
        .collect();
    for &mode in entry.modes {
        let method = Method {
            entry,
            mode: Some(mode),
        };
        // A draft model has no committed one: the target's first 4 layers stand in.
        let draft_layers =
            (entry.default_dir.is_none() && entry.reads("draft_layers", mode)).then_some(4);
        let cfg = DrafterConfig {
            method,
            draft_layers,
            ..Default::default()
        };
        let set = cfg.load(path, lm, 512).unwrap_or_else(|e| {
            panic!("{}: {e}", Method::label_for(entry, mode));
        });
        let got = stepped(lm, &set, &prompts, &params);
        eprintln!("conformance: {} ({} requests)", set.label, got.len());
        for (k, (g, a)) in got.iter().zip(&ar).enumerate() {
            assert_eq!(
                g,
                a,
                "{} (request {k}, T = {})",
                Method::label_for(entry, mode),
                params[k].sampling.temperature
            );
        }
    }
}

#[test]
fn every_method_of_the_table_in_every_mode_equals_ar() {
    one_thread();
    let path = paradraft::fetch::ensure_default_model().unwrap();
    let lm = model::load(&path).unwrap();
    for entry in METHODS {
        conform(entry, &path, &lm);
    }
}

/// A method a newcomer might add: its drafter proposes the last committed token repeated
/// (`k` of them, a chain). One entry, no table line — and the suite above runs it.
struct Echo;

impl Drafter for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn begin(&mut self, _: &[TokenId], _: Hidden) -> Result<()> {
        Ok(())
    }
    fn propose(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<DraftTree> {
        let last = *committed.last().expect("a committed token");
        Ok(DraftTree::chain(&vec![last; max_nodes.min(3)]))
    }
    fn observe(&mut self, _: &Outcome, _: Hidden) -> Result<()> {
        Ok(())
    }
}

struct EchoTemplate;

impl<'t> Template<'t> for EchoTemplate {
    fn fork(&self, _: usize, _: SamplingParams) -> Result<Box<dyn Drafter + 't>> {
        Ok(Box::new(Echo))
    }
}

fn load_echo<'t>(_: &LoadArgs<'_, 't>) -> Result<LoadedMethod<'t>> {
    Ok(LoadedMethod {
        template: Box::new(EchoTemplate),
        max_draft: 3,
    })
}

static ECHO: MethodEntry = MethodEntry {
    name: "echo",
    about: "the last token again",
    modes: &[Mode::Greedy],
    options: &[],
    default_dir: None,
    load: load_echo,
    label: None,
    prefetch: None,
};

#[test]
fn a_new_method_is_one_entry() {
    one_thread();
    let path = paradraft::fetch::ensure_default_model().unwrap();
    let lm = model::load(&path).unwrap();
    conform(&ECHO, &path, &lm);
}
