//! What a drafting method is: each method module declares its [`MethodEntry`] (name, drafting
//! modes, the options it reads, its committed drafter, how it loads); `drafters::methods` lists
//! them in one table. Adding a drafter = one module with its entry + one line there.
//!
//! The options (`DrafterConfig`, vLLM's `speculative_config`) are defined here with the table
//! they name; `speculative_config` reads, checks and loads them.
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

use super::mask_lm::DlmMode;

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
    pub(crate) fn suffix(self) -> &'static str {
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

    pub(crate) fn about(self) -> &'static str {
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

    /// Bytes of the drafter's own K/V cache per target position of a request (what a server
    /// must hold for it beside the target's; 0 for drafters without one).
    fn kv_bytes_per_slot(&self) -> usize {
        0
    }

    /// The most bytes of target states a request's drafter of up to `ctx` positions holds
    /// before taking them in (bounded: what a server counts beside its cache; 0 for drafters
    /// that hold none).
    fn pending_bytes(&self, _ctx: usize) -> usize {
        0
    }

    /// What the requests' drafters have done so far, for reports (`auto`: accepted nodes per
    /// source); `None` when there is nothing to say.
    fn report(&self) -> Option<String> {
        None
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
    /// Finds a method by name (the table is above the method modules; `auto` loads others).
    pub named: fn(&str) -> Result<Method>,
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
    /// Starts loading, on a thread of its own, what `load` will need and the target does not
    /// give (a drafter's weights), so that it overlaps the target's loading
    /// ([`DrafterConfig::prefetch`]); `load` takes it up, or loads as usual without it.
    pub prefetch: Option<fn(&DrafterConfig)>,
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
    /// Plain AR decoding.
    pub fn none() -> Method {
        Method {
            entry: &NONE,
            mode: None,
        }
    }

    pub fn is_none(self) -> bool {
        std::ptr::eq(self.entry, &NONE)
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

impl Serialize for Method {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// The tries open in this process, by `--ngram` path and tokenizer fingerprint (a trie is
/// opened once while a loaded copy lives).
type OpenTries = Vec<(Option<PathBuf>, u64, std::sync::Weak<NgramTrie>)>;
static OPEN_TRIES: std::sync::Mutex<OpenTries> = std::sync::Mutex::new(Vec::new());
/// The tries [`open_trie_ahead`] opened, held until the next [`LoadArgs::trie`].
static TRIES_AHEAD: std::sync::Mutex<Vec<Arc<NgramTrie>>> = std::sync::Mutex::new(Vec::new());

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Opens the trie a load of `cfg` would ask for, ahead (beside the target's weights, on the
/// tokenizer as soon as it is built), when `cfg`'s method reads one: a file of `--ngram`, or
/// the default trie when it is already built (a build, and every error, wait for the load
/// itself, which reports them). A cold `generate --drafter auto` spent ~30 ms after the
/// target's load on the tokenizer's fingerprint and the trie's mapping (2-vCPU Intel Xeon).
pub fn open_trie_ahead(cfg: &DrafterConfig, tok: &crate::model::Tokenizer) {
    let entry = cfg.method.entry;
    if cfg.no_ngram || !entry.reads("ngram", cfg.mode_of(cfg.method)) {
        return;
    }
    let key = (cfg.ngram.clone(), tok.fingerprint());
    let t = match &cfg.ngram {
        Some(path) => NgramTrie::open(path)
            .ok()
            .filter(|t| t.check_stamp(crate::ngram::stamp_of(tok), path).is_ok()),
        None => crate::ngram::defaults::built_trie(tok),
    };
    if let Some(t) = t.map(Arc::new) {
        let mut open = lock(&OPEN_TRIES);
        open.push((key.0, key.1, Arc::downgrade(&t)));
        lock(&TRIES_AHEAD).push(t);
    }
}

impl<'t> LoadArgs<'_, 't> {
    /// The most nodes of a tree, checked against the context.
    pub fn tree_budget(&self) -> Result<usize> {
        let (n, ctx) = (self.cfg.tree_budget, self.ctx);
        if n == 0 || n >= ctx {
            return Err(Error::BadRequest(format!(
                "--tree-budget {n} must be between 1 and the context ({ctx} tokens) minus one"
            )));
        }
        Ok(n)
    }

    /// The tree search settings, with the n-gram trie unless `no_ngram`.
    pub fn tree_drafting(&self) -> Result<TreeDrafting> {
        let (cfg, lm) = (self.cfg, self.lm);
        self.tree_budget()?;
        let ngram = if cfg.no_ngram {
            None
        } else {
            Some(self.trie()?)
        };
        let stop = lm.tokenizer.stop_tokens.iter().copied().collect();
        Ok(TreeDrafting::new(TreeSearchParams::default(), ngram, stop))
    }

    /// The n-gram trie of `ngram` (its tokenizer stamp checked), or the default one, built
    /// from the shipped corpus on first use. One file is opened (and validated: ~20 ms for the
    /// default 31 MB trie on a Zen 5) once while a loaded copy lives: `auto` with `dart` asks
    /// for it twice, as its trie source and for DART's tree pruning.
    pub fn trie(&self) -> Result<Arc<NgramTrie>> {
        let tok = &self.lm.tokenizer;
        let key = (self.cfg.ngram.clone(), tok.fingerprint());
        let mut open = lock(&OPEN_TRIES);
        open.retain(|(_, _, w)| w.strong_count() > 0);
        let ahead = std::mem::take(&mut *lock(&TRIES_AHEAD));
        if let Some(t) = open
            .iter()
            .find(|(p, f, _)| (p, *f) == (&key.0, key.1))
            .and_then(|(_, _, w)| w.upgrade())
        {
            return Ok(t);
        }
        let t = Arc::new(match &self.cfg.ngram {
            Some(path) => {
                let t = NgramTrie::open(path)?;
                t.check_stamp(crate::ngram::stamp_of(tok), path)?;
                t
            }
            None => crate::ngram::defaults::trie(tok)?.1,
        });
        open.push((key.0, key.1, Arc::downgrade(&t)));
        drop(ahead);
        Ok(t)
    }

    /// These arguments for another method (`auto` loading a model source): its committed
    /// drafter unless `model` names one, its default mode.
    pub fn for_method<'b>(&'b self, cfg: &'b DrafterConfig) -> LoadArgs<'b, 't> {
        let entry = cfg.method.entry;
        LoadArgs {
            cfg,
            target_path: self.target_path,
            lm: self.lm,
            ctx: self.ctx,
            dir: cfg
                .draft_model
                .clone()
                .or_else(|| entry.default_drafter_dir())
                .unwrap_or_default(),
            mode: entry.default_mode(),
            named: self.named,
        }
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
    /// The sizing policy (`"fixed_draft": true` is read as `Fixed`).
    pub draft_length: DraftLength,
    /// Most nodes of a searched tree (dflash-tree, dart).
    pub tree_budget: usize,
    /// N-gram trie scoring tree continuity (default: data/ngram/smollm2-135m.trie).
    pub ngram: Option<PathBuf>,
    /// Search trees on the drafter's distributions alone.
    pub no_ngram: bool,
    /// How a block drafter's block becomes a draft (default: the method's own; a method name
    /// such as `dflash-tree` sets it too). `"cps": true` is read as `cps` (DiffuSpec's
    /// causal-consistency path search, for dflash and pard), `"no_cps": true` as `greedy`
    /// (DiffuSpec's raw argmax chain).
    pub drafting: Option<Mode>,
    /// The 3-gram ARPA model CPS scores with (`paradraft ngram arpa`); none: the drafter's
    /// scores alone (diffuspec's default: data/ngram/smollm2-135m.arpa).
    pub ngram_arpa: Option<PathBuf>,
    /// DiffuSpec's drafting mode (fast: cached causal prefix, bidirectional block; faithful:
    /// full re-encode each step; auto: the drafter's training attention).
    pub dlm_mode: DlmMode,
    /// DiffuSpec's refinement steps S.
    pub dlm_steps: usize,
    /// What `auto` drafts from: `pld` (the request's own text), `suffix` (earlier requests'
    /// text), `trie` (the n-gram trie), and model drafters by method name (`dart`, ...).
    pub sources: Vec<String>,
    /// Most tokens of earlier requests' text `auto`'s suffix cache holds (fixed memory).
    pub suffix_cache_tokens: usize,
}

impl Default for DrafterConfig {
    fn default() -> Self {
        DrafterConfig {
            method: Method::none(),
            num_speculative_tokens: 8,
            block_size: None,
            draft_model: None,
            draft_layers: None,
            prompt_lookup_min: 1,
            prompt_lookup_max: 3,
            draft_length: DraftLength::Auto,
            tree_budget: 32,
            ngram: None,
            no_ngram: false,
            drafting: None,
            ngram_arpa: None,
            dlm_mode: DlmMode::Auto,
            dlm_steps: 1,
            sources: DEFAULT_SOURCES.iter().map(|s| s.to_string()).collect(),
            suffix_cache_tokens: 1 << 20,
        }
    }
}

/// `auto`'s sources unless `sources` names others.
pub const DEFAULT_SOURCES: [&str; 4] = ["pld", "suffix", "trie", "dart"];

/// Proposes nothing: the speculative loop then decodes one token per target pass, which makes
/// it the AR baseline with exactly the speculative methods' overheads.
pub struct NoDraft;

impl Drafter for NoDraft {
    fn name(&self) -> &str {
        "none"
    }
    fn begin(&mut self, _: &[crate::types::TokenId], _: crate::speculative::Hidden) -> Result<()> {
        Ok(())
    }
    fn propose(
        &mut self,
        _: &[crate::types::TokenId],
        _: usize,
    ) -> Result<crate::speculative::DraftTree> {
        Ok(crate::speculative::DraftTree::new())
    }
    fn observe(
        &mut self,
        _: &crate::speculative::Outcome,
        _: crate::speculative::Hidden,
    ) -> Result<()> {
        Ok(())
    }
}

impl<'t> Template<'t> for NoDraft {
    fn fork(&self, _: usize, _: SamplingParams) -> Result<Box<dyn Drafter + 't>> {
        Ok(Box::new(NoDraft))
    }
}

/// Plain AR decoding, in the table as the method `none`.
pub static NONE: MethodEntry = MethodEntry {
    name: "none",
    about: "no drafter: plain AR decoding",
    modes: &[Mode::Greedy],
    options: &[],
    default_dir: None,
    load: load_none,
    label: None,
    prefetch: None,
};

fn load_none<'t>(_: &LoadArgs<'_, 't>) -> Result<LoadedMethod<'t>> {
    Ok(LoadedMethod {
        template: Box::new(NoDraft),
        max_draft: 0,
    })
}
