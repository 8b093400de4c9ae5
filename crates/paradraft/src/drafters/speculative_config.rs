//! Choosing a drafter: the methods, their options (vLLM's `--speculative-config` keys), and a
//! [`DrafterSet`] that loads the weights once and gives every request its own drafter.
//!
//! Shared by `generate`, `bench` and `serve`: the CLI only maps its flags onto
//! [`DrafterConfig`].

use super::dart::{Dart, DartModel};
use super::dflash::{Dflash, DflashModel};
use super::diffuspec::{DiffuSpec, DlmMode};
use super::draft_model::DraftModel;
use super::mask_lm::MaskLm;
use super::pard::Pard;
use super::parts::DraftSampling;
use super::pld::PromptLookup;
use super::NoDraft;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::model::{self, Loaded};
use crate::ngram::NgramTrie;
use crate::sample::SamplingParams;
use crate::speculative::cps::AdlParams;
use crate::speculative::sizing::{CostCurve, Sizer};
use crate::speculative::tree_search::{TreeDrafting, TreeSearchParams};
use crate::speculative::{Drafter, Speculation, VerifyRule};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Which drafter proposes tokens; `None` is plain AR decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Method {
    None,
    Pld,
    DraftModel,
    Dflash,
    DflashSample,
    DflashTree,
    Dart,
    Pard,
    PardSample,
    PardTree,
    Diffuspec,
}

impl Method {
    /// Every method with its name and a one-line description.
    pub const ALL: [(Method, &'static str, &'static str); 11] = [
        (Method::None, "none", "no drafter: plain AR decoding"),
        (
            Method::Pld,
            "pld",
            "prompt lookup: n-gram matches over prompt and output",
        ),
        (
            Method::DraftModel,
            "draft-model",
            "a draft model sharing the tokenizer, or the target's first --draft-layers layers",
        ),
        (
            Method::Dflash,
            "dflash",
            "DFlash block-diffusion drafter (greedy block; one-hot q at T > 0)",
        ),
        (
            Method::DflashSample,
            "dflash-sample",
            "DFlash drafting by sampling each slot from its distribution (q known)",
        ),
        (
            Method::DflashTree,
            "dflash-tree",
            "DFlash's block searched into an n-gram-pruned tree (DART's search)",
        ),
        (
            Method::Dart,
            "dart",
            "DART: one-layer parallel drafter + n-gram-pruned tree search",
        ),
        (
            Method::Pard,
            "pard",
            "PARD: target-independent mask-token draft model, K drafts in one pass (greedy chain)",
        ),
        (
            Method::PardSample,
            "pard-sample",
            "PARD drafting by sampling each slot from its distribution (q known)",
        ),
        (
            Method::PardTree,
            "pard-tree",
            "PARD's per-slot distributions searched into an n-gram-pruned tree (DART's search)",
        ),
        (
            Method::Diffuspec,
            "diffuspec",
            "DiffuSpec: diffusion-LM drafter + causal-consistency path search (3-gram proxy) + adaptive draft length",
        ),
    ];

    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|m| m.0 == self).map_or("?", |m| m.1)
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Method {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let want = s.replace('_', "-");
        Self::ALL
            .iter()
            .find(|m| m.1 == want)
            .map(|m| m.0)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|m| m.1).collect();
                Error::BadRequest(format!(
                    "unknown drafter {s:?} (known: {})",
                    names.join(", ")
                ))
            })
    }
}

impl TryFrom<String> for Method {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<Method> for String {
    fn from(m: Method) -> String {
        m.name().to_string()
    }
}

/// How each round's draft size is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DraftLength {
    /// From this machine's measured costs and the acceptance so far (with the speed guard).
    #[default]
    Auto,
    /// Always the most.
    Fixed,
    /// DiffuSpec's adaptive draft length (§4.5), scaled to the drafter's block.
    Adl,
}

/// A drafter and its options. The JSON form is vLLM's `speculative_config` (`method`,
/// `num_speculative_tokens`, `model`, `draft_layers`, `prompt_lookup_min/max`, ...).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DrafterConfig {
    pub method: Method,
    /// Most draft tokens per round (DFlash: block size − 1 unless `block_size` is given).
    pub num_speculative_tokens: usize,
    /// DFlash block size / DART mask slots + 1 at run time (default: as trained).
    pub block_size: Option<usize>,
    /// A draft model (.gguf or HF directory) or a DFlash/DART drafter directory (default: the
    /// committed SmolLM2 drafter).
    #[serde(rename = "model")]
    pub draft_model: Option<PathBuf>,
    /// Draft with the target's first N layers (draft-model).
    pub draft_layers: Option<usize>,
    pub prompt_lookup_min: usize,
    pub prompt_lookup_max: usize,
    /// Always draft the most; otherwise each round is sized from measured costs.
    pub fixed_draft: bool,
    /// The sizing policy (`fixed_draft` is short for `Fixed`).
    pub draft_length: DraftLength,
    /// Most nodes of a searched tree (dflash-tree, dart).
    pub tree_budget: usize,
    /// N-gram trie scoring tree continuity (default: data/ngram/smollm2-135m.trie).
    pub ngram: Option<PathBuf>,
    /// Search trees on the drafter's distributions alone.
    pub no_ngram: bool,
    /// Choose the chain by DiffuSpec's causal-consistency path search over the block's
    /// pruned lattice (dflash, pard).
    pub cps: bool,
    /// The 3-gram ARPA model CPS scores with (`paradraft ngram arpa`); none: the drafter's
    /// scores alone (diffuspec's default: data/ngram/smollm2-135m.arpa).
    pub ngram_arpa: Option<PathBuf>,
    /// DiffuSpec without CPS: the raw per-slot argmax chain.
    pub no_cps: bool,
    /// DiffuSpec's drafting mode (fast: cached causal prefix, bidirectional block; faithful:
    /// full re-encode each step; auto: the drafter's training attention).
    pub dlm_mode: DlmMode,
    /// DiffuSpec's refinement steps S.
    pub dlm_steps: usize,
}

impl Default for DrafterConfig {
    fn default() -> Self {
        DrafterConfig {
            method: Method::None,
            num_speculative_tokens: 8,
            block_size: None,
            draft_model: None,
            draft_layers: None,
            prompt_lookup_min: 1,
            prompt_lookup_max: 3,
            fixed_draft: false,
            draft_length: DraftLength::Auto,
            tree_budget: 32,
            ngram: None,
            no_ngram: false,
            cps: false,
            ngram_arpa: None,
            no_cps: false,
            dlm_mode: DlmMode::Auto,
            dlm_steps: 1,
        }
    }
}

/// The committed drafter of a method for SmolLM2-135M-Instruct (found in `$PARADRAFT_HOME`,
/// beside the installed binary or in the source tree: `fetch::resource`).
pub fn default_drafter_dir(m: Method) -> Option<PathBuf> {
    let name = match m {
        Method::Dflash | Method::DflashSample | Method::DflashTree => "smollm2-135m-dflash",
        Method::Dart => "smollm2-135m-dart",
        Method::Pard | Method::PardSample | Method::PardTree => "smollm2-135m-pard",
        Method::Diffuspec => "smollm2-135m-dlm",
        _ => return None,
    };
    Some(crate::fetch::resource_path(&format!("drafters/{name}")))
}

impl DrafterConfig {
    /// These options with the keys of a vLLM-style JSON object (`method` required) replacing
    /// theirs; unknown keys are refused.
    pub fn with_json(&self, js: &str) -> Result<DrafterConfig> {
        let bad = |e: String| Error::BadRequest(format!("speculative config: {e}"));
        let v: serde_json::Value = serde_json::from_str(js).map_err(|e| bad(e.to_string()))?;
        let obj = v
            .as_object()
            .ok_or_else(|| bad("want a JSON object".into()))?;
        if !obj.contains_key("method") {
            return Err(bad("\"method\" is required".into()));
        }
        let mut base = serde_json::to_value(self).map_err(|e| bad(e.to_string()))?;
        for (k, v) in obj {
            base[k] = v.clone();
        }
        serde_json::from_value(base).map_err(|e| bad(e.to_string()))
    }

    /// Refuses options that none of `methods` would use (they would be silently ignored).
    pub fn check_used(&self, methods: &[Method]) -> Result<()> {
        use Method::*;
        let d = DrafterConfig::default();
        let trees: &[Method] = &[DflashTree, Dart, PardTree];
        let checks: [(bool, &str, &[Method]); 10] = [
            (
                self.draft_model.is_some(),
                "--draft-model (\"model\")",
                &[
                    DraftModel,
                    Dflash,
                    DflashSample,
                    DflashTree,
                    Dart,
                    Pard,
                    PardSample,
                    PardTree,
                    Diffuspec,
                ],
            ),
            (self.draft_layers.is_some(), "--draft-layers", &[DraftModel]),
            (
                self.block_size.is_some(),
                "--block-size",
                &[Dflash, DflashSample, DflashTree, Dart],
            ),
            (self.ngram.is_some(), "--ngram", trees),
            (self.no_ngram != d.no_ngram, "--no-ngram", trees),
            (self.cps, "--cps", &[Dflash, Pard]),
            (
                self.ngram_arpa.is_some(),
                "--ngram-arpa",
                &[Dflash, Pard, Diffuspec],
            ),
            (self.no_cps, "--no-cps", &[Diffuspec]),
            (self.dlm_mode != d.dlm_mode, "--dlm-mode", &[Diffuspec]),
            (self.dlm_steps != d.dlm_steps, "--dlm-steps", &[Diffuspec]),
        ];
        for (given, name, users) in checks {
            if given && !methods.iter().any(|m| users.contains(m)) {
                let join = |ms: &[Method]| -> String {
                    ms.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ")
                };
                return Err(Error::BadRequest(format!(
                    "{name} has no effect with {} (it applies to {})",
                    join(methods),
                    join(users)
                )));
            }
        }
        Ok(())
    }

    /// The tree search settings, with the n-gram trie unless `no_ngram`.
    fn tree_drafting(&self, lm: &Loaded, ctx: usize) -> Result<TreeDrafting> {
        if self.tree_budget == 0 || self.tree_budget >= ctx {
            return Err(Error::BadRequest(format!(
                "--tree-budget {} must be between 1 and the context ({ctx} tokens) minus one",
                self.tree_budget
            )));
        }
        let ngram = if self.no_ngram {
            None
        } else {
            let t = match &self.ngram {
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

    /// The sizing policy these options ask for.
    pub fn sizing(&self) -> Result<DraftLength> {
        match (self.fixed_draft, self.draft_length) {
            (true, DraftLength::Adl) => Err(Error::BadRequest(
                "--fixed-draft and --draft-length adl exclude each other".into(),
            )),
            (true, _) => Ok(DraftLength::Fixed),
            (false, d) => Ok(d),
        }
    }

    /// DiffuSpec's path search with the ARPA model of `ngram_arpa` (its tokenizer stamp
    /// checked): on with `--cps` (dflash, pard) and for diffuspec unless `--no-cps`, which
    /// defaults to the default model (`ngram::defaults`, built on first use).
    fn cps_drafting(&self, lm: &Loaded) -> Result<Option<super::parts::CpsDrafting>> {
        let diffuspec = self.method == Method::Diffuspec;
        let on = if diffuspec { !self.no_cps } else { self.cps };
        if !on {
            if self.ngram_arpa.is_some() {
                let why = if diffuspec {
                    "is unused with --no-cps"
                } else {
                    "needs --cps"
                };
                return Err(Error::BadRequest(format!("--ngram-arpa {why}")));
            }
            return Ok(None);
        }
        let ngram = match (&self.ngram_arpa, diffuspec) {
            (Some(p), _) => {
                let m = crate::ngram::arpa::ArpaLm::read(p)?;
                m.check_stamp(crate::ngram::stamp_of(&lm.tokenizer), p)?;
                Some(Arc::new(m))
            }
            // The default 3-gram model, built from the shipped corpus on first use.
            (None, true) => Some(Arc::new(crate::ngram::defaults::arpa(&lm.tokenizer)?.1)),
            (None, false) => None,
        };
        Ok(Some(super::parts::CpsDrafting {
            lattice: Default::default(),
            cps: Default::default(),
            ngram,
            stop: lm.tokenizer.stop_tokens.iter().copied().collect(),
        }))
    }

    /// Loads the drafter's weights once for a target (`target_path`, loaded as `lm`) whose
    /// requests hold up to `ctx` tokens.
    pub fn load<'t>(
        &self,
        target_path: &Path,
        lm: &'t Loaded,
        ctx: usize,
    ) -> Result<DrafterSet<'t>> {
        let k = self.num_speculative_tokens;
        if self.method != Method::None {
            if k == 0 || k >= ctx {
                return Err(Error::BadRequest(format!(
                    "num_speculative_tokens {k} must be between 1 and the context ({ctx} tokens) minus one"
                )));
            }
            if self.prompt_lookup_max > ctx {
                return Err(Error::BadRequest(format!(
                    "prompt_lookup_max {} exceeds the context ({ctx} tokens)",
                    self.prompt_lookup_max
                )));
            }
        }
        let dir = || {
            self.draft_model
                .clone()
                .or_else(|| default_drafter_dir(self.method))
                .unwrap_or_default()
        };
        let (template, max_draft) = match self.method {
            Method::None => (Template::None, 0),
            Method::Dflash | Method::DflashSample | Method::DflashTree => {
                let dir = dir();
                let m = DflashModel::load(&dir)
                    .map_err(|e| e.context(format!("loading DFlash drafter {}", dir.display())))?;
                let mut d = Dflash::new(m, &lm.model, ctx, self.block_size, Default::default())?;
                if self.method == Method::DflashSample {
                    d.drafting.sampling = DraftSampling::Sample;
                }
                let mut max = d.block_size - 1;
                d.drafting.cps = self.cps_drafting(lm)?;
                if self.method == Method::DflashTree {
                    d.drafting.tree = Some(self.tree_drafting(lm, ctx)?);
                    max = self.tree_budget;
                }
                (Template::Dflash(Box::new(d)), max)
            }
            Method::Dart => {
                let dir = dir();
                let (m, head) = DartModel::load(&dir, true)
                    .map_err(|e| e.context(format!("loading DART drafter {}", dir.display())))?;
                let tree = self.tree_drafting(lm, ctx)?;
                let masks = self.block_size.map(|b| b.saturating_sub(1));
                let d = Dart::new(m, head, &lm.model, ctx, masks, tree)?;
                (Template::Dart(Box::new(d)), self.tree_budget)
            }
            Method::Pard | Method::PardSample | Method::PardTree => {
                let dir = dir();
                let m = MaskLm::load(&dir, target_path, lm, "PARD")
                    .map_err(|e| e.context(format!("loading PARD drafter {}", dir.display())))?;
                let mut d = Pard::new(m, ctx, k, Default::default())?;
                if self.method == Method::PardSample {
                    d.drafting.sampling = DraftSampling::Sample;
                }
                let mut max = k;
                d.drafting.cps = self.cps_drafting(lm)?;
                if self.method == Method::PardTree {
                    d.drafting.tree = Some(self.tree_drafting(lm, ctx)?);
                    max = self.tree_budget;
                }
                (Template::Pard(Box::new(d)), max)
            }
            Method::Diffuspec => {
                let dir = dir();
                let m = MaskLm::load(&dir, target_path, lm, "DiffuSpec").map_err(|e| {
                    e.context(format!("loading DiffuSpec drafter {}", dir.display()))
                })?;
                if m.diffusion.is_none() {
                    return Err(Error::BadRequest(format!(
                        "{} is not a diffusion drafter (no dlm_attention, not a Dream model): use --drafter pard for PARD drafters",
                        dir.display()
                    )));
                }
                let mut d =
                    DiffuSpec::new(m, ctx, k, self.dlm_steps, self.dlm_mode, Default::default())?;
                d.drafting.cps = self.cps_drafting(lm)?;
                (Template::DiffuSpec(Box::new(d)), k)
            }
            Method::Pld => {
                if self.prompt_lookup_min == 0 || self.prompt_lookup_min > self.prompt_lookup_max {
                    return Err(Error::BadRequest(
                        "prompt lookup needs 1 <= prompt_lookup_min <= prompt_lookup_max".into(),
                    ));
                }
                let p = PromptLookup {
                    min_ngram: self.prompt_lookup_min,
                    max_ngram: self.prompt_lookup_max,
                    draft_len: k,
                };
                (Template::Pld(p), k)
            }
            Method::DraftModel => {
                let draft = match (&self.draft_model, self.draft_layers) {
                    (Some(p), layers) => model::load_truncated(p, layers)
                        .map_err(|e| e.context(format!("loading draft model {}", p.display())))?,
                    (None, Some(n)) => model::load_truncated(target_path, Some(n))?,
                    (None, None) => {
                        return Err(Error::BadRequest(
                            "--drafter draft-model needs --draft-model PATH or --draft-layers N"
                                .into(),
                        ))
                    }
                };
                let vocab = lm.model.config.vocab_size;
                let d = DraftModel::new(draft.model, vocab, ctx, k, Default::default())?;
                (Template::DraftModel(Box::new(d)), k)
            }
        };
        let sizing = self.sizing()?;
        Ok(DrafterSet {
            template,
            max_draft,
            ctx,
            method: self.method,
            label: self.label(),
            adaptive: sizing != DraftLength::Fixed,
            adl: (sizing == DraftLength::Adl).then(|| {
                if max_draft >= 30 {
                    AdlParams::default()
                } else {
                    AdlParams::for_block(max_draft)
                }
            }),
            costs: None,
        })
    }

    /// The name reports use: the method, or which draft model.
    pub fn label(&self) -> String {
        match (self.method, &self.draft_model, self.draft_layers) {
            (Method::DraftModel, Some(p), _) => format!(
                "draft:{}",
                p.file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default()
            ),
            (Method::DraftModel, None, Some(n)) => format!("self-draft-{n}L"),
            (Method::None, ..) => "none".into(),
            (Method::Diffuspec, ..) if self.no_cps => "diffuspec-raw".into(),
            (m, ..) if self.cps => format!("{}-cps", m.name()),
            (m, ..) => m.name().into(),
        }
    }
}

/// A fresh drafter of each kind, never begun: what every request's drafter is forked from.
enum Template<'t> {
    None,
    Pld(PromptLookup),
    Dflash(Box<Dflash<'t>>),
    Dart(Box<Dart<'t>>),
    DraftModel(Box<DraftModel>),
    Pard(Box<Pard>),
    DiffuSpec(Box<DiffuSpec>),
}

/// A loaded drafter: weights shared by every request, per-request state made by
/// [`DrafterSet::create`].
pub struct DrafterSet<'t> {
    template: Template<'t>,
    /// The most nodes a drafter of this set proposes per round (0 without a drafter).
    pub max_draft: usize,
    ctx: usize,
    pub method: Method,
    /// The name reports use.
    pub label: String,
    /// Whether each round's draft is sized from measured costs ([`DrafterSet::measure_costs`]).
    pub adaptive: bool,
    /// Sized by DiffuSpec's adaptive draft length instead (these settings).
    pub adl: Option<AdlParams>,
    /// The target's verify-cost curve and the drafter's proposal-cost curve.
    costs: Option<(CostCurve, CostCurve)>,
}

impl<'t> DrafterSet<'t> {
    /// A drafter for one request sampled with `sampling` (drafters that sample draw with the
    /// target's keyed noise).
    pub fn create(&self, sampling: SamplingParams) -> Result<Box<dyn Drafter + 't>> {
        Ok(match &self.template {
            Template::None => Box::new(NoDraft),
            Template::Pld(p) => Box::new(p.clone()),
            Template::Dflash(d) => Box::new(d.fork(self.ctx, sampling)?),
            Template::Dart(d) => Box::new(d.fork(self.ctx)),
            Template::DraftModel(d) => Box::new(d.fork(self.ctx, sampling)?),
            Template::Pard(d) => Box::new(d.fork(self.ctx, sampling)?),
            Template::DiffuSpec(d) => Box::new(d.fork(self.ctx, sampling)?),
        })
    }

    /// Measures what a proposal costs on this machine and keeps it with the target's verify
    /// costs `target` ([`CostCurve::measure`]), so that each round's draft is sized by what
    /// pays; nothing to do without a drafter or with fixed drafts.
    pub fn measure_costs(&mut self, model: &Model, target: &CostCurve) -> Result<()> {
        if !self.adaptive || self.is_ar() {
            return Ok(());
        }
        let mut d = self.create(SamplingParams::default())?;
        let dc = CostCurve::measure_drafter(model, d.as_mut(), 64, self.max_draft, 3)?;
        self.costs = Some((target.clone(), dc));
        Ok(())
    }

    /// One request's drafter, draft limit, sizer (when costs were measured) and rule.
    pub fn speculation(
        &self,
        sampling: SamplingParams,
        rule: VerifyRule,
    ) -> Result<Speculation<'t>> {
        Ok(Speculation {
            drafter: self.create(sampling)?,
            max_draft: self.max_draft,
            sizer: self.costs.as_ref().map(|(t, d)| {
                let s = Sizer::new(t.clone()).with_draft_curve(Some(d.clone()));
                match self.adl {
                    Some(p) => s.with_adl(p),
                    None => s,
                }
            }),
            rule,
        })
    }

    /// Whether requests decode without a drafter.
    pub fn is_ar(&self) -> bool {
        matches!(self.template, Template::None)
    }

    /// The target layers whose states the drafters read.
    pub fn taps(&self) -> Vec<usize> {
        match &self.template {
            Template::Dflash(d) => d.taps().to_vec(),
            Template::Dart(d) => d.taps().to_vec(),
            _ => vec![],
        }
    }
}
