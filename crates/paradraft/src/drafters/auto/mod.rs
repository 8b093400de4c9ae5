//! `auto`: drafts from every source at once — prompt lookup over the request's own text, a
//! suffix cache over earlier requests' text (shared by a server's requests), the n-gram trie,
//! and a model drafter — merged into one tree whose nodes are priced by the acceptance observed
//! for their source, depth and score ([`merge`]); the sizer then cuts the tree where nodes stop
//! paying on this machine. Every node is a deterministic draft (one-hot q: a function of the
//! text and, when the request samples, of the target's keyed noise), so the core's
//! verification keeps decoding lossless at any temperature.

mod gate;
pub mod merge;
pub mod recycle;
mod round;

use super::registry::{DrafterConfig, LoadArgs, LoadedMethod, MethodEntry, Mode, Template};
use crate::error::{Error, Result};
use crate::ngram::suffix::{ContNode, Continuations, SuffixIndex};
use crate::ngram::NgramTrie;
use crate::sample::{Sampler, SamplingParams};
use crate::speculative::{BatchPrice, DraftTree, Drafter, Hidden, Outcome, SharedPass};
use crate::types::TokenId;
use gate::ModelGate;
use merge::{merge, Calibration, Merged, Proposal};
use recycle::RecycleTable;
use round::{poisoned, Gathered};
use std::sync::{Arc, Mutex};

/// Deepest continuation a lookup source proposes.
const MAX_DEPTH: usize = 24;
/// Matches a lookup source reads.
const MAX_MATCHES: usize = 8;
/// N-gram lengths the lookup indexes hash.
const ORDERS: [usize; 3] = [1, 2, 4];
/// The trie source's tree: children per node (at the root, below it), least probability, most
/// nodes and depth.
const TRIE_WIDTH: (usize, usize) = (3, 2);
const TRIE_MIN_P: (f32, f32) = (0.1, 0.25);
const TRIE_NODES: usize = 12;
const TRIE_DEPTH: usize = 5;
/// Most nodes asked of the model source (the merged tree is cut by the sizer anyway).
const MODEL_NODES: usize = 12;

/// Where `auto` drafts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Pld,
    Suffix,
    Trie,
    Recycle,
    Model,
}

/// A match of `len` tokens, as a calibration class.
fn length_class(len: usize) -> u8 {
    match len {
        0 | 1 => 0,
        2..=3 => 1,
        4..=7 => 2,
        8..=15 => 3,
        _ => 4,
    }
}

/// Per source: nodes verified with their parent accepted, and accepted.
#[derive(Clone, Debug, Default)]
pub struct SourceStats {
    pub names: Vec<String>,
    pub verified: Vec<u64>,
    pub accepted: Vec<u64>,
}

impl std::fmt::Display for SourceStats {
    /// `pld 120/300 suffix 0/0 ...`: accepted of verified nodes, per source (a node several
    /// sources proposed counts for each).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: u64 = self.accepted.iter().sum();
        for (i, n) in self.names.iter().enumerate() {
            let share = if total > 0 {
                100.0 * self.accepted[i] as f64 / total as f64
            } else {
                0.0
            };
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(
                f,
                "{n} {}/{} accepted ({share:.0}% of accepted credits)",
                self.accepted[i], self.verified[i]
            )?;
        }
        Ok(())
    }
}

/// What every request's drafter shares: the suffix cache, the recycled candidates, the
/// calibration, the statistics.
struct Shared {
    cache: Option<Mutex<SuffixIndex>>,
    recycle: Option<Mutex<RecycleTable>>,
    calib: Mutex<Calibration>,
    stats: Mutex<SourceStats>,
    /// The model gate's timed rounds, greedy sessions' and sampling ones'.
    arms: [gate::Arms; 2],
}

/// `auto` loaded: its sources and what they share.
pub struct AutoTemplate<'t> {
    kinds: Vec<Kind>,
    trie: Option<Arc<NgramTrie>>,
    model: Option<Box<dyn Template<'t> + 't>>,
    shared: Arc<Shared>,
}

/// One request's `auto` drafter.
pub struct Auto<'t> {
    kinds: Vec<Kind>,
    trie: Option<Arc<NgramTrie>>,
    model: Option<Box<dyn Drafter + 't>>,
    taps: Vec<usize>,
    shared: Arc<Shared>,
    /// The request's prompt and output so far (prompt lookup's index over it, when a source).
    text: Vec<TokenId>,
    own: Option<SuffixIndex>,
    last: Merged,
    select_ms: f64,
    /// The model source's proposal, last round (drafting, not selection).
    model_ms: f64,
    gate: ModelGate,
    /// The model source's bit in [`Merged::sources`] when it ran this round.
    model_bit: Option<u32>,
    /// Nodes verified last round.
    verified_last: usize,
    /// The request's sampler when it samples (T > 0): its nodes are priced by what sampling
    /// requests accepted and by their tokens' noise.
    sampler: Option<Sampler>,
    /// The last proposal's root (the committed text's last token).
    root: Option<TokenId>,
    /// A round [`Drafter::prepare`]d: its lookups and the gate's answer, for the proposal.
    gathered: Option<Gathered>,
}

impl<'t> Template<'t> for AutoTemplate<'t> {
    fn fork(&self, ctx: usize, sampling: SamplingParams) -> Result<Box<dyn Drafter + 't>> {
        let model = match &self.model {
            Some(m) => Some(m.fork(ctx, sampling)?),
            None => None,
        };
        Ok(Box::new(Auto {
            kinds: self.kinds.clone(),
            trie: self.trie.clone(),
            taps: model
                .as_ref()
                .map(|m| m.taps().to_vec())
                .unwrap_or_default(),
            model,
            shared: self.shared.clone(),
            text: Vec::new(),
            own: self
                .kinds
                .contains(&Kind::Pld)
                .then(|| SuffixIndex::new(ctx, &ORDERS)),
            last: Merged::default(),
            select_ms: 0.0,
            model_ms: 0.0,
            gate: ModelGate::sharing(
                &self.shared.arms[!sampling.is_greedy() as usize],
                sampling.is_greedy(),
            ),
            model_bit: None,
            verified_last: 0,
            sampler: (!sampling.is_greedy())
                .then(|| Sampler::new(sampling))
                .transpose()?,
            root: None,
            gathered: None,
        }))
    }

    fn taps(&self) -> Vec<usize> {
        self.model.as_ref().map(|m| m.taps()).unwrap_or_default()
    }

    fn kv_bytes_per_slot(&self) -> usize {
        self.model.as_ref().map_or(0, |m| m.kv_bytes_per_slot())
    }

    fn pending_bytes(&self, ctx: usize) -> usize {
        self.model.as_ref().map_or(0, |m| m.pending_bytes(ctx))
    }

    fn report(&self) -> Option<String> {
        let s = self.shared.stats.lock().ok()?;
        Some(format!("auto sources: {s}"))
    }
}

impl Drafter for Auto<'_> {
    fn name(&self) -> &str {
        "auto"
    }

    fn taps(&self) -> &[usize] {
        &self.taps
    }

    fn begin(&mut self, prompt: &[TokenId], hidden: Hidden) -> Result<()> {
        self.text.clear();
        self.text.extend_from_slice(prompt);
        if let Some(ix) = self.own.as_mut() {
            *ix = SuffixIndex::new(ix.capacity(), &ORDERS);
            ix.extend(prompt);
        }
        self.last = Merged::default();
        match self.model.as_mut() {
            Some(m) => m.begin(prompt, hidden),
            None => Ok(()),
        }
    }

    fn propose(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<DraftTree> {
        let g = match self.gathered.take() {
            Some(g) if g.len == committed.len() && g.max_nodes == max_nodes => g,
            _ => self.gather(committed, max_nodes)?,
        };
        self.finish(committed, max_nodes, g)
    }

    /// The lookups and the gate's answer now; the model's call, when it is asked, queued in
    /// its batched pass.
    fn prepare(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<Option<SharedPass>> {
        let g = self.gather(committed, max_nodes)?;
        let pass = match self.model.as_mut() {
            Some(m) if g.ask => match m.prepare(committed, max_nodes.min(MODEL_NODES)) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("auto: model source left out of this request: {e}");
                    self.model = None;
                    None
                }
            },
            _ => None,
        };
        self.gathered = Some(g);
        Ok(pass)
    }

    fn shared_ms(&self) -> f64 {
        match (&self.model, self.model_bit) {
            (Some(m), Some(_)) => m.shared_ms(),
            _ => 0.0,
        }
    }

    fn batch(&mut self, price: BatchPrice) {
        self.gate.streams = price.streams;
        self.gate.step_hint = price.step_ms;
        self.gate.row_ms = price.row_ms;
        if let Some(m) = self.model.as_mut() {
            m.batch(price);
        }
    }

    fn observe(&mut self, outcome: &Outcome, hidden: Hidden) -> Result<()> {
        self.verified_last = outcome.drafted;
        self.gate.committed(outcome.accepted.len() + 1);
        if let (Some(t), Some(root)) = (&self.shared.recycle, self.root) {
            let tree = &self.last.tree;
            t.lock()
                .map_err(|_| poisoned())?
                .learn(&outcome.top, |r| match r {
                    0 => Some(root),
                    r if r <= tree.len() => {
                        Some(tree.token(crate::speculative::NodeId(r as u32 - 1)))
                    }
                    _ => None,
                });
        }
        let (mut only_model, mut model_nodes) = (0, 0);
        if !self.last.tree.is_empty() {
            let mut calib = self.shared.calib.lock().map_err(|_| poisoned())?;
            let seen = self.last.learn(outcome, &mut calib);
            drop(calib);
            if let Some(bit) = self.model_bit {
                model_nodes = seen.iter().filter(|&&(s, _)| s == bit).count();
                only_model = seen.iter().filter(|&&(s, a)| a && s == bit).count();
            }
            let mut st = self.shared.stats.lock().map_err(|_| poisoned())?;
            for (sources, accepted) in seen {
                for s in 0..st.names.len() {
                    if sources & (1 << s) != 0 {
                        st.verified[s] += 1;
                        st.accepted[s] += accepted as u64;
                    }
                }
            }
        }
        if self.model_bit.is_some() {
            self.gate.ran(self.model_ms, only_model, model_nodes);
        }
        if let Some(m) = self.model.as_mut() {
            if let Err(e) = m.observe(outcome, hidden) {
                eprintln!("auto: model source left out of this request: {e}");
                self.model = None;
            }
        }
        Ok(())
    }

    fn node_confidence(&self) -> Option<&[f32]> {
        Some(&self.last.conf)
    }

    fn selection_ms(&self) -> f64 {
        self.select_ms
    }

    fn candidates(&self) -> usize {
        if self.shared.recycle.is_some() {
            recycle::K
        } else {
            0
        }
    }
}

/// The request's text joins the suffix cache when it ends.
impl Drop for Auto<'_> {
    fn drop(&mut self) {
        if let Some(Ok(mut ix)) = self.shared.cache.as_ref().map(|c| c.lock()) {
            ix.extend(&self.text);
            ix.end_document();
        }
    }
}

pub static METHOD: MethodEntry = MethodEntry {
    name: "auto",
    about: "every source at once (prompt lookup, suffix cache, n-gram trie, recycled candidates, a model drafter) in one calibrated tree",
    modes: &[Mode::Tree],
    options: &[
        ("sources", None),
        ("suffix_cache_tokens", None),
        ("model", None),
        ("ngram", None),
        ("block_size", None),
    ],
    default_dir: None,
    load,
    label: None,
    prefetch: Some(prefetch),
};

/// Starts loading the model source among `cfg`'s sources, as [`source`] will ask for it.
fn prefetch(cfg: &DrafterConfig) {
    for name in &cfg.sources {
        let Ok(m) = super::registry::Method::named(name) else {
            continue;
        };
        if let (true, Some(p)) = (is_model_source(&m), m.entry.prefetch) {
            p(&source_config(cfg, m));
        }
    }
}

fn load<'t>(a: &LoadArgs<'_, 't>) -> Result<LoadedMethod<'t>> {
    let cfg = a.cfg;
    if cfg.sources.is_empty() {
        return Err(Error::BadRequest(
            "auto needs at least one source (pld, suffix, trie, recycle, or a model drafter)"
                .into(),
        ));
    }
    let max_draft = a.tree_budget()?;
    for (i, n) in cfg.sources.iter().enumerate() {
        if cfg.sources[..i].contains(n) {
            return Err(Error::BadRequest(format!(
                "auto's source {n:?} is listed twice"
            )));
        }
    }
    let defaults = cfg.sources == super::registry::DEFAULT_SOURCES;
    let (mut kinds, mut names) = (vec![], vec![]);
    let (mut trie, mut model) = (None, None);
    for name in &cfg.sources {
        match source(a, name, &mut model, &mut trie) {
            Ok(kind) => {
                kinds.push(kind);
                names.push(name.clone());
            }
            // A default source that cannot load is left out with a warning; one the user
            // named is an error.
            Err(e) if defaults => eprintln!("auto: source {name} left out: {e}"),
            Err(e) => return Err(e),
        }
    }
    if kinds.is_empty() {
        return Err(Error::BadRequest("auto: no source could be loaded".into()));
    }
    let cache = (kinds.contains(&Kind::Suffix) && cfg.suffix_cache_tokens > 0)
        .then(|| Mutex::new(SuffixIndex::new(cfg.suffix_cache_tokens, &ORDERS)));
    let recycle = kinds
        .contains(&Kind::Recycle)
        .then(|| Mutex::new(RecycleTable::default()));
    let n = names.len();
    let shared = Arc::new(Shared {
        cache,
        recycle,
        calib: Mutex::new(Calibration::default()),
        stats: Mutex::new(SourceStats {
            names,
            verified: vec![0; n],
            accepted: vec![0; n],
        }),
        arms: Default::default(),
    });
    Ok(LoadedMethod {
        template: Box::new(AutoTemplate {
            kinds,
            trie,
            model,
            shared,
        }),
        max_draft,
    })
}

/// Loads the source `name` (a model source into `model`, the trie into `trie`).
/// Whether `m` can be `auto`'s model source: a drafter of its own, not AR, prompt lookup or
/// `auto` itself.
fn is_model_source(m: &super::registry::Method) -> bool {
    !m.is_none() && !["pld", "auto"].contains(&m.entry.name)
}

/// The configuration `auto`'s model source `m` is loaded (and prefetched) with.
fn source_config(cfg: &DrafterConfig, m: super::registry::Method) -> DrafterConfig {
    DrafterConfig {
        method: m,
        sources: vec![],
        ..cfg.clone()
    }
}

fn source<'t>(
    a: &LoadArgs<'_, 't>,
    name: &str,
    model: &mut Option<Box<dyn Template<'t> + 't>>,
    trie: &mut Option<Arc<NgramTrie>>,
) -> Result<Kind> {
    Ok(match name {
        "pld" => Kind::Pld,
        "suffix" => Kind::Suffix,
        "recycle" => Kind::Recycle,
        "trie" => {
            *trie = Some(a.trie().map_err(|e| e.context("auto's source trie"))?);
            Kind::Trie
        }
        other => {
            let m = (a.named)(other).map_err(|e| {
                e.context(format!(
                    "auto's source {other:?} (sources: pld, suffix, trie, recycle, or a model drafter)"
                ))
            })?;
            if !is_model_source(&m) {
                return Err(Error::BadRequest(format!(
                    "auto's source {other:?} is not a model drafter"
                )));
            }
            if model.is_some() {
                return Err(Error::BadRequest(
                    "auto takes one model drafter among its sources".into(),
                ));
            }
            let sub = source_config(a.cfg, m);
            let loaded = (m.entry.load)(&a.for_method(&sub))
                .map_err(|e| e.context(format!("auto's source {other}")))?;
            *model = Some(loaded.template);
            Kind::Model
        }
    })
}
