//! The drafting methods, one table: each method module declares its [`MethodEntry`] (name,
//! drafting modes, the options it reads, its committed drafter, how it loads) and this file
//! lists them. Adding a drafter = one module with its entry + one line in [`METHODS`].
//!
//! How a block becomes a draft (greedy, sampled or CPS chain, searched tree) is a setting of
//! the shared selection ([`Mode`], `parts::Selection`), not a method of its own; the names
//! `dflash-tree`, `pard-sample`, `diffuspec-raw`, ... are a method with a mode.

use super::parts::{CpsDrafting, Selection};
use crate::error::{Error, Result};
use crate::model::Loaded;
use crate::ngram::NgramTrie;
use crate::sample::SamplingParams;
use crate::speculative::tree_search::{TreeDrafting, TreeSearchParams};
use crate::speculative::Drafter;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::speculative_config::DrafterConfig;

/// Every method, in the order `--help` lists them.
pub static METHODS: &[&MethodEntry] = &[
    &super::NONE,
    &super::pld::METHOD,
    &super::draft_model::METHOD,
    &super::dflash::METHOD,
    &super::dart::METHOD,
    &super::pard::METHOD,
    &super::diffuspec::METHOD,
];

/// How a block drafter turns its per-slot distributions into a draft (`parts::Selection`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Each slot's argmax.
    Greedy,
    /// Each slot sampled from its distribution, q attached.
    Sample,
    /// An n-gram-pruned tree (DART's search).
    Tree,
    /// DiffuSpec's causal-consistency path search.
    Cps,
}

impl Mode {
    const ALL: [Mode; 4] = [Mode::Greedy, Mode::Sample, Mode::Tree, Mode::Cps];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Greedy => "greedy",
            Mode::Sample => "sample",
            Mode::Tree => "tree",
            Mode::Cps => "cps",
        }
    }

    /// The suffix of a method name drafting this way (`dflash-tree`, `diffuspec-raw`).
    fn suffix(self) -> &'static str {
        match self {
            Mode::Greedy => "raw",
            m => m.name(),
        }
    }

    /// The command-line spelling, for messages.
    pub fn flag(self) -> &'static str {
        match self {
            Mode::Greedy => "--no-cps",
            Mode::Cps => "--cps",
            Mode::Sample => "--drafting sample",
            Mode::Tree => "--drafting tree",
        }
    }

    fn about(self) -> &'static str {
        match self {
            Mode::Greedy => "each slot's argmax",
            Mode::Sample => "drafting by sampling each slot from its distribution (q known)",
            Mode::Tree => {
                "its per-slot distributions searched into an n-gram-pruned tree (DART's search)"
            }
            Mode::Cps => "the chain chosen by causal-consistency path search",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                Error::BadRequest(format!(
                    "unknown drafting mode {s:?} (known: greedy, sample, tree, cps)"
                ))
            })
    }
}

/// A loaded drafter that every request's drafter is forked from (never begun itself).
pub trait Template<'t> {
    /// A drafter for one request of up to `ctx` tokens sampled with `sampling`.
    fn fork(&self, ctx: usize, sampling: SamplingParams) -> Result<Box<dyn Drafter + 't>>;

    /// The target layers whose states the drafters read.
    fn taps(&self) -> Vec<usize> {
        vec![]
    }
}

/// What a method's `load` returns: the template and the most nodes it proposes per round.
pub struct LoadedMethod<'t> {
    pub template: Box<dyn Template<'t> + 't>,
    pub max_draft: usize,
}

/// What a method's `load` is given.
pub struct LoadArgs<'a, 't> {
    pub cfg: &'a DrafterConfig,
    /// The target's path (mask-token drafters read its tokenizer files) and its loaded model.
    pub target_path: &'a Path,
    pub lm: &'t Loaded,
    /// The target's KV capacity per request.
    pub ctx: usize,
    /// The drafter directory: `model` or the method's committed drafter.
    pub dir: PathBuf,
    pub mode: Mode,
}

/// One drafting method.
pub struct MethodEntry {
    pub name: &'static str,
    pub about: &'static str,
    /// The drafting modes it takes, its default first.
    pub modes: &'static [Mode],
    /// Options it reads beyond the shared ones (`DrafterConfig` keys), each with the mode
    /// that reads it (`None`: every mode).
    pub options: &'static [(&'static str, Option<Mode>)],
    /// Its committed drafter for SmolLM2-135M-Instruct, under `drafters/`.
    pub default_dir: Option<&'static str>,
    pub load: for<'a, 't> fn(&LoadArgs<'a, 't>) -> Result<LoadedMethod<'t>>,
    /// The name reports use, when it is not the method's (a draft model names its file).
    pub label: Option<fn(&DrafterConfig) -> String>,
}

impl MethodEntry {
    pub fn default_mode(&self) -> Mode {
        self.modes[0]
    }

    /// Whether it reads `key` when drafting in `mode`.
    pub fn reads(&self, key: &str, mode: Mode) -> bool {
        self.options
            .iter()
            .any(|&(k, m)| k == key && m.is_none_or(|m| m == mode))
    }

    /// The committed drafter's directory (`$PARADRAFT_HOME`, beside the binary or the source
    /// tree: `fetch::resource`).
    pub fn default_drafter_dir(&self) -> Option<PathBuf> {
        self.default_dir
            .map(|n| crate::fetch::resource_path(&format!("drafters/{n}")))
    }
}

/// A method as asked for: an entry, with the mode its name gave (`dflash-tree`).
#[derive(Clone, Copy)]
pub struct Method {
    pub entry: &'static MethodEntry,
    pub mode: Option<Mode>,
}

impl Method {
    /// The method named `name` (`_` read as `-`), e.g. `dart`, `dflash-tree`, `diffuspec-raw`.
    pub fn named(name: &str) -> Result<Method> {
        let want = name.replace('_', "-");
        for e in METHODS {
            if e.name == want {
                return Ok(Method {
                    entry: e,
                    mode: None,
                });
            }
            for &m in e.modes.iter().skip(1) {
                if want.strip_prefix(e.name).and_then(|r| r.strip_prefix('-')) == Some(m.suffix()) {
                    return Ok(Method {
                        entry: e,
                        mode: Some(m),
                    });
                }
            }
        }
        Err(Error::BadRequest(format!(
            "unknown drafter {name:?} (known: {})",
            Method::listed()
                .iter()
                .map(|m| m.0.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }

    /// Plain AR decoding.
    pub fn none() -> Method {
        Method {
            entry: &super::NONE,
            mode: None,
        }
    }

    pub fn is_none(self) -> bool {
        std::ptr::eq(self.entry, &super::NONE)
    }

    /// What `--help` lists: every method, and its sampled and tree modes, with a description.
    pub fn listed() -> Vec<(Method, String)> {
        let mut out = vec![];
        for e in METHODS {
            out.push((
                Method {
                    entry: e,
                    mode: None,
                },
                e.about.to_string(),
            ));
            for &m in e.modes.iter().skip(1) {
                if matches!(m, Mode::Sample | Mode::Tree) {
                    let about = format!("{}: {}", e.name, m.about());
                    out.push((
                        Method {
                            entry: e,
                            mode: Some(m),
                        },
                        about,
                    ));
                }
            }
        }
        out
    }

    /// The name of this method drafting in `mode`: the method's own for its default mode.
    pub fn label_for(entry: &MethodEntry, mode: Mode) -> String {
        if mode == entry.default_mode() {
            entry.name.to_string()
        } else {
            format!("{}-{}", entry.name, mode.suffix())
        }
    }
}

impl PartialEq for Method {
    fn eq(&self, o: &Self) -> bool {
        std::ptr::eq(self.entry, o.entry) && self.mode == o.mode
    }
}
impl Eq for Method {}

impl std::fmt::Debug for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Method({self})")
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.mode {
            Some(m) => f.write_str(&Method::label_for(self.entry, m)),
            None => f.write_str(self.entry.name),
        }
    }
}

impl std::str::FromStr for Method {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Method::named(s)
    }
}

impl Serialize for Method {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Method {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Method::named(&s).map_err(serde::de::Error::custom)
    }
}

impl LoadArgs<'_, '_> {
    /// The tree search settings, with the n-gram trie unless `no_ngram`.
    pub fn tree_drafting(&self) -> Result<TreeDrafting> {
        let (cfg, lm, ctx) = (self.cfg, self.lm, self.ctx);
        if cfg.tree_budget == 0 || cfg.tree_budget >= ctx {
            return Err(Error::BadRequest(format!(
                "--tree-budget {} must be between 1 and the context ({ctx} tokens) minus one",
                cfg.tree_budget
            )));
        }
        let ngram = if cfg.no_ngram {
            None
        } else {
            let t = match &cfg.ngram {
                Some(path) => {
                    let t = NgramTrie::open(path)?;
                    t.check_stamp(crate::ngram::stamp_of(&lm.tokenizer), path)?;
                    t
                }
                // The default trie, built from the shipped corpus on first use.
                None => crate::ngram::defaults::trie(&lm.tokenizer)?.1,
            };
            Some(Arc::new(t))
        };
        let stop = lm.tokenizer.stop_tokens.iter().copied().collect();
        Ok(TreeDrafting::new(TreeSearchParams::default(), ngram, stop))
    }

    /// DiffuSpec's path search with the ARPA model of `ngram_arpa` (its tokenizer stamp
    /// checked); without one, diffuspec scores with the default model (`ngram::defaults`,
    /// built on first use), the others with the drafter's scores alone.
    fn cps_drafting(&self, default_model: bool) -> Result<CpsDrafting> {
        let lm = self.lm;
        let ngram = match &self.cfg.ngram_arpa {
            Some(p) => {
                let m = crate::ngram::arpa::ArpaLm::read(p)?;
                m.check_stamp(crate::ngram::stamp_of(&lm.tokenizer), p)?;
                Some(Arc::new(m))
            }
            None if default_model => Some(Arc::new(crate::ngram::defaults::arpa(&lm.tokenizer)?.1)),
            None => None,
        };
        Ok(CpsDrafting {
            lattice: Default::default(),
            cps: Default::default(),
            ngram,
            stop: lm.tokenizer.stop_tokens.iter().copied().collect(),
        })
    }

    /// The shared selection of this mode; the tree's budget is `max_draft` for trees.
    pub fn selection(&self) -> Result<Selection> {
        if self.mode != Mode::Cps && self.cfg.ngram_arpa.is_some() {
            let why = if self.method_default() == Mode::Cps {
                "is unused with --no-cps"
            } else {
                "needs --cps"
            };
            return Err(Error::BadRequest(format!("--ngram-arpa {why}")));
        }
        Ok(match self.mode {
            Mode::Greedy => Selection::Greedy,
            Mode::Sample => Selection::Sample,
            Mode::Tree => Selection::Tree(self.tree_drafting()?),
            // A method that drafts by CPS by default scores with the default model.
            Mode::Cps => Selection::Cps(self.cps_drafting(self.method_default() == Mode::Cps)?),
        })
    }

    fn method_default(&self) -> Mode {
        self.cfg.method.entry.default_mode()
    }

    /// The most nodes a block drafter of `chain` slots proposes in this mode.
    pub fn max_draft(&self, chain: usize) -> usize {
        if self.mode == Mode::Tree {
            self.cfg.tree_budget
        } else {
            chain
        }
    }

    /// `e` with the drafter directory and what was loading (`what`, e.g. "DFlash drafter").
    pub fn loading(&self, what: &str) -> impl FnOnce(Error) -> Error + '_ {
        let what = format!("loading {what} {}", self.dir.display());
        move |e: Error| e.context(what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every listed name parses back to its method; names are unique; modes are the entry's.
    #[test]
    fn every_method_and_mode_is_named_once() {
        let listed = Method::listed();
        let mut names: Vec<String> = listed.iter().map(|m| m.0.to_string()).collect();
        for (m, _) in &listed {
            assert_eq!(Method::named(&m.to_string()).unwrap(), *m);
            assert!(m.mode.is_none_or(|x| m.entry.modes.contains(&x)));
        }
        names.sort();
        names.dedup();
        assert_eq!(names.len(), listed.len());
        for e in METHODS {
            assert!(!e.modes.is_empty(), "{}", e.name);
            for &m in e.modes {
                let label = Method::label_for(e, m);
                let parsed = Method::named(&label).unwrap();
                assert!(std::ptr::eq(parsed.entry, *e), "{label}");
            }
        }
        // Underscores read as dashes (vLLM's spelling); the old method names still parse.
        for (name, mode) in [
            ("dflash_tree", Some(Mode::Tree)),
            ("pard-sample", Some(Mode::Sample)),
            ("diffuspec-raw", Some(Mode::Greedy)),
            ("dart", None),
        ] {
            assert_eq!(Method::named(name).unwrap().mode, mode, "{name}");
        }
        let e = Method::named("dart-sample").unwrap_err().to_string();
        assert!(
            e.contains("unknown drafter") && e.contains("dflash-tree"),
            "{e}"
        );
        assert!(Method::named("none").unwrap().is_none());
    }

    /// The configuration: modes resolve per method, unused options are refused naming who
    /// reads them, the older JSON keys map onto the new ones.
    #[test]
    fn modes_options_and_older_keys() {
        let m = |s: &str| Method::named(s).unwrap();
        let cfg = DrafterConfig {
            drafting: Some(Mode::Tree),
            ..Default::default()
        };
        assert_eq!(cfg.mode_of(m("dflash")), Mode::Tree);
        assert_eq!(cfg.mode_of(m("dflash-sample")), Mode::Sample);
        assert_eq!(
            cfg.mode_of(m("diffuspec")),
            Mode::Cps,
            "diffuspec draws no tree"
        );
        assert!(cfg.check_used(&[m("pard"), m("pld")]).is_ok());
        let e = cfg.check_used(&[m("pld")]).unwrap_err().to_string();
        assert!(e.contains("--drafting tree has no effect with pld"), "{e}");
        let no_cps = DrafterConfig {
            drafting: Some(Mode::Greedy),
            ..Default::default()
        };
        let e = no_cps.check_used(&[m("pard")]).unwrap_err().to_string();
        assert!(e.contains("--no-cps") && e.contains("diffuspec"), "{e}");
        let arpa = DrafterConfig {
            ngram_arpa: Some("x.arpa".into()),
            ..no_cps.clone()
        };
        let e = arpa.check_used(&[m("diffuspec")]).unwrap_err().to_string();
        assert!(
            e.contains("--ngram-arpa has no effect with diffuspec --no-cps"),
            "{e}"
        );
        assert!(DrafterConfig {
            drafting: None,
            ..arpa
        }
        .check_used(&[m("diffuspec")])
        .is_ok());
        let base = DrafterConfig::default();
        let c = base
            .with_json(r#"{"method": "dflash", "cps": true, "fixed_draft": true}"#)
            .unwrap();
        assert_eq!(c.drafting, Some(Mode::Cps));
        assert_eq!(
            c.draft_length,
            super::super::speculative_config::DraftLength::Fixed
        );
        assert_eq!(c.label(), "dflash-cps");
        let c = base
            .with_json(r#"{"method": "diffuspec", "no_cps": true}"#)
            .unwrap();
        assert_eq!(c.label(), "diffuspec-raw");
        for bad in [
            r#"{"method": "dflash", "cps": true, "drafting": "tree"}"#,
            r#"{"method": "dflash", "cps": 1}"#,
            r#"{"method": "dflash", "drafting": "wide"}"#,
            r#"{"method": "dflash", "speed": 2}"#,
        ] {
            assert!(base.with_json(bad).is_err(), "{bad}");
        }
    }
}
