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

use super::registry::{DrafterConfig, LoadArgs, LoadedMethod, MethodEntry, Mode, Template};
use crate::error::{Error, Result};
use crate::ngram::suffix::{ContNode, Continuations, SuffixIndex};
use crate::ngram::NgramTrie;
use crate::sample::{Sampler, SamplingParams};
use crate::speculative::{BatchPrice, DraftTree, Drafter, Hidden, Outcome};
use crate::types::TokenId;
use gate::ModelGate;
use merge::{merge, Calibration, Merged, Proposal};
use recycle::RecycleTable;
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

/// The trie's most likely continuations of `ctx` as a small tree: a few children at the root,
/// fewer below, each with its probability given its parent; and the length of the context
/// that matched at the root.
fn trie_tree(trie: &NgramTrie, ctx: &[TokenId], max_depth: usize) -> (usize, Vec<ContNode>) {
    let keep = trie.order().saturating_sub(1).max(1);
    let tail = &ctx[ctx.len().saturating_sub(keep)..];
    let (matched, first) = trie.continuations(tail, TRIE_WIDTH.0);
    let mut nodes: Vec<ContNode> = first
        .into_iter()
        .filter(|&(_, p)| p >= TRIE_MIN_P.0)
        .map(|(token, share)| ContNode {
            parent: None,
            token,
            share,
        })
        .collect();
    let mut depth = vec![1usize; nodes.len()];
    let mut i = 0;
    while i < nodes.len() && nodes.len() < TRIE_NODES {
        if depth[i] < max_depth.min(TRIE_DEPTH) {
            // The node's context: the committed tail, then the path down to it.
            let mut path = vec![nodes[i].token];
            let mut p = nodes[i].parent;
            while let Some(q) = p {
                path.push(nodes[q].token);
                p = nodes[q].parent;
            }
            path.reverse();
            let mut c: Vec<TokenId> = tail.to_vec();
            c.extend_from_slice(&path);
            let c = &c[c.len().saturating_sub(keep)..];
            for (token, share) in trie.continuations(c, TRIE_WIDTH.1).1 {
                if share >= TRIE_MIN_P.1 && nodes.len() < TRIE_NODES {
                    nodes.push(ContNode {
                        parent: Some(i),
                        token,
                        share,
                    });
                    depth.push(depth[i] + 1);
                }
            }
        }
        i += 1;
    }
    (matched, nodes)
}

/// A lookup's continuations as a proposal of `source`, classed by match length.
fn lookup(source: u8, c: Continuations) -> Option<Proposal> {
    (!c.nodes.is_empty()).then(|| Proposal {
        lead: false,
        source,
        class: length_class(c.longest),
        nodes: c.nodes,
    })
}

/// A model drafter's tree as a proposal: each node scored by its probability given its parent
/// (its path probability over its parent's; a chain without them, 0.5 each).
fn tree_proposal(source: u8, tree: &DraftTree, conf: Option<&[f32]>) -> Proposal {
    let nodes = (0..tree.len())
        .map(|i| {
            let n = crate::speculative::NodeId(i as u32);
            let parent = tree.parent(n);
            let share = match conf {
                Some(c) if c.len() == tree.len() => {
                    let above = parent.map_or(1.0, |p| c[p.idx()]);
                    if above > 0.0 {
                        (c[i] / above).clamp(0.0, 1.0)
                    } else {
                        0.0
                    }
                }
                _ => 0.5,
            };
            ContNode {
                parent: parent.map(|p| p.idx()),
                token: tree.token(n),
                share,
            }
        })
        .collect();
    Proposal {
        lead: true,
        source,
        class: 0,
        nodes,
    }
}

impl Auto<'_> {
    /// The model source's proposal (at most [`MODEL_NODES`] nodes), timed.
    fn model_proposal(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<Proposal> {
        let s = self
            .kinds
            .iter()
            .position(|&k| k == Kind::Model)
            .unwrap_or(0) as u8;
        let m = self
            .model
            .as_mut()
            .ok_or_else(|| Error::BadRequest("auto: no model source".into()))?;
        let t = std::time::Instant::now();
        let tree = m.propose(committed, max_nodes.min(MODEL_NODES))?;
        self.model_ms = t.elapsed().as_secs_f64() * 1e3;
        self.select_ms += m.selection_ms();
        self.model_bit = Some(1 << s);
        Ok(tree_proposal(s, &tree, m.node_confidence()))
    }

    /// A round that does not ask the model still shows it the text, as a proposal of no node
    /// (what a drafter that keeps pending states uses to keep them bounded).
    fn keep_model_up(&mut self, committed: &[TokenId]) {
        if let Some(m) = self.model.as_mut() {
            if let Err(e) = m.propose(committed, 0) {
                eprintln!("auto: model source left out of this request: {e}");
                self.model = None;
            }
        }
    }

    /// The lookup sources' proposals for a tree of at most `max_nodes` nodes after `committed`.
    fn proposals(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<Vec<Proposal>> {
        let depth = max_nodes.min(MAX_DEPTH);
        let mut out = Vec::with_capacity(self.kinds.len());
        for (s, &kind) in self.kinds.iter().enumerate() {
            let s = s as u8;
            let p = match kind {
                Kind::Pld => self
                    .own
                    .as_ref()
                    .and_then(|ix| lookup(s, ix.continuations(committed, MAX_MATCHES, depth))),
                Kind::Suffix => match &self.shared.cache {
                    Some(c) => {
                        let ix = c.lock().map_err(|_| poisoned())?;
                        lookup(s, ix.continuations(committed, MAX_MATCHES, depth))
                    }
                    None => None,
                },
                Kind::Trie => self.trie.as_deref().and_then(|t| {
                    let (matched, nodes) = trie_tree(t, committed, depth);
                    (!nodes.is_empty()).then_some(Proposal {
                        lead: false,
                        source: s,
                        class: matched as u8,
                        nodes,
                    })
                }),
                Kind::Recycle => match (&self.shared.recycle, committed.last()) {
                    (Some(t), Some(&root)) => {
                        let nodes = t.lock().map_err(|_| poisoned())?.tree(root, depth);
                        (!nodes.is_empty()).then_some(Proposal {
                            lead: false,
                            source: s,
                            class: 0,
                            nodes,
                        })
                    }
                    _ => None,
                },
                Kind::Model => None, // asked by `propose` when the gate says so
            };
            out.extend(p);
        }
        Ok(out)
    }
}

fn poisoned() -> Error {
    Error::BadRequest("auto: a shared table was poisoned by a failed request".into())
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
        if committed.len() > self.text.len() {
            let new = &committed[self.text.len()..];
            if let Some(ix) = self.own.as_mut() {
                ix.extend(new);
            }
            self.text.extend_from_slice(new);
        }
        (self.select_ms, self.model_ms, self.model_bit) = (0.0, 0.0, None);
        self.root = committed.last().copied();
        self.gate.round_starts(self.verified_last == 0);
        self.last = Merged::default();
        if max_nodes == 0 {
            self.keep_model_up(committed);
            return Ok(DraftTree::new());
        }
        let t = std::time::Instant::now();
        let mut props = self.proposals(committed, max_nodes)?;
        // The root stands at the committed text's last position.
        let sampler = self.sampler;
        let coupled = sampler.as_ref().map(|s| (s, committed.len() - 1));
        let shared = self.shared.clone();
        let merged = |props: &[Proposal]| -> Result<Merged> {
            let calib = shared.calib.lock().map_err(|_| poisoned())?;
            merge(props, &calib, max_nodes, coupled)
        };
        // The gate weighs the model against what the lookups alone expect, unless it runs the
        // model every round: then the lookups are merged once, with the model's proposal.
        let ask = match &self.model {
            None => false,
            Some(_) if self.gate.every_round() => true,
            Some(_) => {
                self.last = merged(&props)?;
                let expected: f64 = self.last.conf.iter().map(|&c| c as f64).sum();
                self.gate.run(expected)
            }
        };
        if !ask {
            self.keep_model_up(committed);
        }
        if ask {
            match self.model_proposal(committed, max_nodes) {
                Ok(p) => props.push(p),
                // A source that fails is left out for the rest of the request; the
                // request goes on with the others.
                Err(e) => {
                    eprintln!("auto: model source left out of this request: {e}");
                    self.model = None;
                    self.model_bit = None;
                }
            }
        }
        // The lookups-only merge the gate read stands when the model was not asked; otherwise
        // (or with no model, or one that just failed) merge what was proposed.
        if ask || self.model.is_none() {
            self.last = merged(&props)?;
        }
        // Selection: the lookups and the merge, and the model's own (not its forward).
        self.select_ms += t.elapsed().as_secs_f64() * 1e3 - self.model_ms;
        Ok(self.last.tree.clone())
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
