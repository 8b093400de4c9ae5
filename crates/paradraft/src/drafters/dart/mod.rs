//! DART (Liu et al., "DART: Diffusion-Inspired Speculative Decoding with N-gram Tree
//! Pruning"): one drafter layer predicts a whole block of future positions in one pass from
//! the target's hidden states, and a continuity-aware tree search turns its per-depth
//! distributions into a draft tree.
//!
//! - §3.1 architecture (docs/dart.md) → [`model`]: taps fused into the real slots, `mask_rep`
//!   slots, shifted logits (each slot predicts two positions to its right), double final norm.
//! - §3.2 one round (docs/dart.md) → [`Dart`] (this file): pending target states are fed with the
//!   next tokens' embeddings, the masks are appended and dropped again after the call.
//! - §3.3 tree pruning (docs/dart.md) → `crate::speculative::tree_search` (shared with DFlash-tree), with
//!   the n-gram trie of `crate::ngram` (docs/dart.md).
//! - §3.4 training (docs/dart.md) → `crate::train::dart`.
//!
//! Verification is the core's: the greedy tree rule, and at T > 0 the coupled rule (or
//! recursive rejection over siblings with one-hot q). At T > 0 the search ranks each depth's
//! tokens by what the target will sample there: the drafter's log-probability plus the
//! target's own keyed Gumbel noise at that position (coupled drafting).

pub mod config;
pub mod depth;
pub mod model;
mod queue;

pub use config::{dart_taps, DartConfig};
pub use model::DartModel;

use crate::drafters::parts::{BlockDrafter, BlockDrafting, DraftHead, Selection};
use crate::drafters::registry::{DraftLength, LoadArgs, LoadedMethod, MethodEntry, Mode, Template};
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::Model;
use crate::sample::SamplingParams;
use crate::speculative::{BatchPrice, DraftTree, Drafter, Hidden, Outcome, PassQueue, SharedPass};
use crate::types::TokenId;
use depth::SharedDepths;
use queue::DartQueue;
use std::sync::Arc;

/// Prompt positions a request's drafter in a batch keeps as pending states (a row of the
/// target's taps each) until its first proposal, rather than passing them through its layer
/// when the request starts ([`Dart::catch_up`]).
const LAZY_ROWS: usize = 256;

/// A DART drafter bound to its target (whose embedding it uses).
pub struct Dart<'t> {
    /// The weights, shared by every request's drafter.
    model: Arc<DartModel>,
    head: DraftHead,
    target: &'t Model,
    taps: Vec<usize>,
    kv: KvCache,
    /// Target states of committed positions `kv.len()..` not yet fed to the drafter.
    pending: Vec<f32>,
    /// The prompt tokens to the right of the first pending positions (all but the prompt's
    /// last, whose token to the right is the first root), while they wait.
    lazy_next: Vec<TokenId>,
    /// Mask slots per call (≤ the trained `draft_length`; depths = masks + 1): the most.
    pub masks: usize,
    /// Under adaptive sizing a tree drafts only the depths the target accepts often enough
    /// ([`depth`]), learned with the process's other requests; `None`: always `masks + 1`.
    depths: Option<SharedDepths>,
    /// Depths the last proposal computed (its masks + 1; 0: none) — a depth counts as tried
    /// even when the cut verified none of its nodes: its mask was paid for — and the
    /// proposal itself.
    drafted_depth: usize,
    proposed: DraftTree,
    /// The shared selection: a searched tree, or a sampled chain.
    drafting: BlockDrafting,
    s: model::Scratch,
    hidden: Vec<f32>,
    logits: Vec<f32>,
    /// Batched drafting: the pass the template's forks share, this drafter's call queued
    /// there (its id, with the committed length it was prepared for; the cache, the pending
    /// states and the logits buffer are the queue's meanwhile), and the last proposal's share
    /// of its pass.
    queue: Arc<DartQueue>,
    job: Option<(u64, usize)>,
    shared_ms: f64,
}

impl Drop for Dart<'_> {
    /// A call still queued goes with its drafter.
    fn drop(&mut self) {
        self.reclaim();
    }
}

impl<'t> Dart<'t> {
    /// `ctx`: the target's KV capacity. `masks`: mask slots per call (default: trained).
    /// `selection`: DART's tree search ([`Selection::Tree`], the paper's), or a chain
    /// ([`Selection::Sample`]: each slot sampled from its distribution, q attached).
    pub fn new(
        model: impl Into<Arc<DartModel>>,
        head: DraftHead,
        target: &'t Model,
        ctx: usize,
        masks: Option<usize>,
        selection: impl Into<Selection>,
    ) -> Result<Self> {
        let model = model.into();
        model.config.check_target(&target.config)?;
        let taps = config::dart_taps(target.config.n_layers)?;
        let masks = masks.unwrap_or(model.config.draft_length);
        if masks == 0 {
            return Err(Error::BadRequest(
                "DART needs at least one mask slot (draft length ≥ 1)".into(),
            ));
        }
        let kv = model.new_kv(ctx + masks + 1);
        let queue = Arc::new(DartQueue::new(model.clone(), &head, target));
        Ok(Dart {
            queue,
            job: None,
            shared_ms: 0.0,
            model,
            head,
            target,
            taps,
            kv,
            pending: vec![],
            lazy_next: vec![],
            masks,
            depths: None,
            drafted_depth: 0,
            proposed: DraftTree::new(),
            drafting: BlockDrafting::new(SamplingParams::default(), selection.into())?,
            s: model::Scratch::default(),
            hidden: vec![],
            logits: vec![],
        })
    }

    /// A drafter for another request: the same weights, head and tree settings, its own
    /// context (`ctx` target positions). Its drafts are deterministic: `sampling` only checked.
    pub fn fork(&self, ctx: usize, sampling: SamplingParams) -> Result<Self> {
        Ok(Dart {
            queue: self.queue.clone(),
            job: None,
            shared_ms: 0.0,
            model: self.model.clone(),
            head: self.head.fork(),
            target: self.target,
            taps: self.taps.clone(),
            kv: self.model.new_kv(ctx + self.masks + 1),
            pending: vec![],
            lazy_next: vec![],
            masks: self.masks,
            depths: self.depths.clone(),
            drafted_depth: 0,
            proposed: DraftTree::new(),
            drafting: self.drafting.fork(sampling)?,
            s: model::Scratch::default(),
            hidden: vec![],
            logits: vec![],
        })
    }

    pub fn config(&self) -> &DartConfig {
        &self.model.config
    }

    /// Passes the prompt positions [`Drafter::begin`] left pending (all but the last) through
    /// the drafter's layer now.
    fn catch_up(&mut self) -> Result<()> {
        let next = std::mem::take(&mut self.lazy_next);
        self.feed(&next)
    }

    /// Passes the first `next.len()` pending positions (`next`: the tokens to their right)
    /// through the drafter's layer into its cache.
    fn feed(&mut self, next: &[TokenId]) -> Result<()> {
        if next.is_empty() {
            return Ok(());
        }
        let rows = next.len() * self.model.feature_width();
        self.model.forward(
            self.target,
            &mut self.kv,
            &self.pending[..rows],
            next,
            0,
            &mut self.s,
            &mut self.hidden,
        )?;
        self.pending.drain(..rows);
        self.lazy_next.clear();
        Ok(())
    }

    /// Takes back a call prepared but not proposed from (its pass run or not, the cache and
    /// the pending states agree: the pass moves the states into the cache).
    fn reclaim(&mut self) {
        if let Some(job) = self.job.take().and_then(|(id, _)| self.queue.take(id)) {
            (self.kv, self.pending, self.logits) = (job.kv, job.features, job.logits);
        }
    }

    /// The drafter's cached positions and pending states (their count) before `committed`'s
    /// root, checked to meet it.
    fn state_at(&self, committed: &[TokenId]) -> Result<(usize, usize)> {
        let (p0, m) = (self.kv.len(), self.pending_positions());
        let s = committed.len().saturating_sub(1); // the root's position
        if committed.is_empty() || p0 + m != s {
            return Err(Error::BadRequest(format!(
                "DART holds states up to position {} but the root is at {s}",
                p0 + m
            )));
        }
        Ok((p0, m))
    }

    /// The mask slots of a call whose real slots end at `end`, for `max_nodes` (≥ 1) nodes;
    /// the depths it computes are recorded for [`Drafter::observe`].
    fn masks_for(&mut self, end: usize, max_nodes: usize) -> usize {
        let room = self.kv.capacity().saturating_sub(end);
        let masks = (self.depths() - 1).min(max_nodes - 1).min(room);
        self.drafted_depth = masks + 1;
        masks
    }

    /// The draft from the depths' logits (`v` per row) of a call whose root is at `s`.
    fn select(
        &mut self,
        committed: &[TokenId],
        v: usize,
        s: usize,
        max_nodes: usize,
    ) -> Result<DraftTree> {
        // Slot i predicts position s + 1 + i.
        let tree = self
            .drafting
            .draft(&self.logits, v, &self.head, committed, s + 1, max_nodes)?;
        if self.depths.is_some() {
            self.proposed.clone_from(&tree);
        }
        Ok(tree)
    }

    /// Committed positions whose target states wait to enter the drafter's cache.
    pub fn pending_positions(&self) -> usize {
        self.pending.len() / self.model.feature_width()
    }

    /// The depths the next proposal may draft (before the node budget): the learned ones, or
    /// every trained one.
    pub fn depths(&self) -> usize {
        match &self.depths {
            Some(d) => d.with(self.drafting.samples(), |r| depth::worth(r, self.masks + 1)),
            None => self.masks + 1,
        }
    }

    /// Trees draft only the depths worth their mask slots ([`depth`]); chains are sized by
    /// the session's sizer already.
    pub fn learning_depth(mut self) -> Self {
        if self.drafting.is_tree() {
            self.depths = Some(SharedDepths::default());
        }
        self
    }
}

pub static METHOD: MethodEntry = MethodEntry {
    name: "dart",
    about: "DART: parallel drafter (one layer, or more) + n-gram-pruned tree search",
    modes: &[Mode::Tree, Mode::Sample],
    options: &[
        ("model", None),
        ("block_size", None),
        ("ngram", Some(Mode::Tree)),
        ("no_ngram", Some(Mode::Tree)),
    ],
    default_dir: Some("smollm2-135m-dart"),
    load,
    label: None,
    prefetch: Some(prefetch),
};

/// Starts loading the DART drafter `cfg` names (or the committed one) on a thread of its own.
fn prefetch(cfg: &super::registry::DrafterConfig) {
    if let Some(dir) = cfg
        .draft_model
        .clone()
        .or_else(|| METHOD.default_drafter_dir())
    {
        model::prefetch(&dir);
    }
}

fn load<'t>(a: &LoadArgs<'_, 't>) -> Result<LoadedMethod<'t>> {
    let (m, head) = model::load_prefetched(&a.dir).map_err(a.loading("DART drafter"))?;
    let masks = a.cfg.block_size.map(|b| b.saturating_sub(1));
    let mut d = Dart::new(m, head, &a.lm.model, a.ctx, masks, a.selection()?)?;
    if a.cfg.draft_length == DraftLength::Auto {
        d = d.learning_depth();
    }
    // A sampled chain is a node per depth (the masks + 1); a tree is cut to the tree budget.
    let max_draft = a.max_draft(d.masks + 1);
    Ok(LoadedMethod {
        template: Box::new(d),
        max_draft,
    })
}

impl<'t> Template<'t> for Dart<'t> {
    fn fork(&self, ctx: usize, sampling: SamplingParams) -> Result<Box<dyn Drafter + 't>> {
        Ok(Box::new(Dart::fork(self, ctx, sampling)?))
    }
    fn taps(&self) -> Vec<usize> {
        self.taps.clone()
    }
    fn kv_bytes_per_slot(&self) -> usize {
        self.kv.bytes_per_slot()
    }

    /// At most twice the lazy prompt rows after a proposal, and one round's positions more.
    fn pending_bytes(&self, ctx: usize) -> usize {
        (2 * LAZY_ROWS + crate::speculative::ROUND_POSITIONS).min(ctx)
            * self.model.feature_width()
            * std::mem::size_of::<f32>()
    }
}

impl BlockDrafter for Dart<'_> {
    fn drafting_mut(&mut self) -> &mut BlockDrafting {
        &mut self.drafting
    }
}

impl Drafter for Dart<'_> {
    fn name(&self) -> &str {
        "dart"
    }

    fn taps(&self) -> &[usize] {
        &self.taps
    }

    /// The drafter's prefill, partly lazy: the prompt's last [`LAZY_ROWS`] positions wait as
    /// pending states (the last one must: it waits for the first root, the token to its
    /// right); positions before them enter the drafter's cache now. A request alone passes
    /// the waiting ones before its first proposal ([`Drafter::batch`]), one in a batch with
    /// it: a request never asked for a proposal (`auto` in a batch where its model does not
    /// pay) never pays for its prompt's pass.
    fn begin(&mut self, prompt: &[TokenId], hidden: Hidden) -> Result<()> {
        self.reclaim();
        self.kv.clear();
        self.pending.clear();
        self.lazy_next.clear();
        let width = self.model.feature_width();
        let n = hidden.rows.len() / width;
        if n != prompt.len() {
            return Err(Error::BadRequest(format!(
                "DART got target states for {n} of {} prompt positions",
                prompt.len()
            )));
        }
        let now = n.saturating_sub(LAZY_ROWS);
        if now > 0 {
            self.model.forward(
                self.target,
                &mut self.kv,
                &hidden.rows[..now * width],
                &prompt[1..=now],
                0,
                &mut self.s,
                &mut self.hidden,
            )?;
        }
        self.pending.extend_from_slice(&hidden.rows[now * width..]);
        self.lazy_next
            .extend_from_slice(&prompt[(now + 1).min(n)..]);
        Ok(())
    }

    fn propose(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<DraftTree> {
        self.shared_ms = 0.0;
        let s = committed.len() - 1; // the root's position
        if let Some((id, len)) = self.job.take() {
            // Prepared: the call's output is the queue's (its pass run now if the step did
            // not run it: nothing happens when every queued call has run).
            self.queue.run(self.target);
            let job = self
                .queue
                .take(id)
                .ok_or_else(|| Error::BadRequest("DART: a queued drafting call was lost".into()))?;
            (self.kv, self.pending, self.logits) = (job.kv, job.features, job.logits);
            let (v, ms) = job
                .done
                .unwrap_or_else(|| Err("DART: a queued drafting call did not run".into()))
                .map_err(Error::BadRequest)?;
            if len != committed.len() {
                return Err(Error::BadRequest(format!(
                    "DART was prepared for {len} committed tokens, asked for {}",
                    committed.len()
                )));
            }
            self.shared_ms = ms;
            self.lazy_next.clear();
            return self.select(committed, v, s, max_nodes);
        }
        let (p0, m) = self.state_at(committed)?;
        if max_nodes == 0 && m > 2 * LAZY_ROWS {
            // Asked for nothing (held, or `auto` not asking its model) while states pile up:
            // pass them now, a chunk at a time, so that a request's pending states stay
            // bounded (each is 3 target rows of floats).
            self.feed(&committed[p0 + 1..=s])?;
        }
        if max_nodes == 0 || m == 0 {
            return Ok(DraftTree::new());
        }
        let masks = self.masks_for(p0 + m, max_nodes);
        // Slot i (position p0 + i) reads the token one to its right.
        self.model.forward(
            self.target,
            &mut self.kv,
            &self.pending,
            &committed[p0 + 1..=s],
            masks,
            &mut self.s,
            &mut self.hidden,
        )?;
        self.pending.clear();
        self.lazy_next.clear();
        let v = self
            .head
            .logits(self.target, &self.hidden, &mut self.logits);
        self.select(committed, v, s, max_nodes)
    }

    /// Queues this round's call in the pass the template's forks share (nothing to queue
    /// when asked for no node or holding no new state: `propose` then does what it does).
    fn prepare(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<Option<SharedPass>> {
        self.reclaim(); // a call prepared for a round that never proposed
        let (p0, m) = self.state_at(committed)?;
        if max_nodes == 0 || m == 0 {
            return Ok(None);
        }
        let masks = self.masks_for(p0 + m, max_nodes);
        let kv = std::mem::replace(&mut self.kv, self.model.new_kv(0));
        let id = self.queue.push(
            kv,
            std::mem::take(&mut self.pending),
            committed[p0 + 1..].to_vec(),
            masks,
            std::mem::take(&mut self.logits),
        );
        self.job = Some((id, committed.len()));
        Ok(Some(SharedPass(self.queue.clone())))
    }

    fn shared_ms(&self) -> f64 {
        self.shared_ms
    }

    /// Alone, the prompt's waiting positions are passed before the first proposal, outside
    /// its time (what its cost and its gate learn is a round's drafting, not the prompt's).
    fn batch(&mut self, price: BatchPrice) {
        if price.streams <= 1 {
            // A failure here shows again at the proposal, which feeds the same states.
            let _ = self.catch_up();
        }
    }

    fn observe(&mut self, outcome: &Outcome, hidden: Hidden) -> Result<()> {
        self.reclaim();
        if let Some(d) = &self.depths {
            // Rounds with verified nodes teach how deep the target accepts this drafter's
            // tree (under `auto` the accepted path may be another source's).
            if outcome.drafted > 0 && self.drafted_depth > 0 {
                let (depth, reach) = (self.drafted_depth, self.proposed.path_len(&outcome.tokens));
                d.with(self.drafting.samples(), |r| r.observe(depth, reach));
            }
        }
        self.drafted_depth = 0;
        self.pending.extend_from_slice(hidden.rows);
        Ok(())
    }

    fn node_confidence(&self) -> Option<&[f32]> {
        self.drafting.node_confidence()
    }

    /// The tree search's time in the last proposal (the drafter's forward is draft time).
    fn selection_ms(&self) -> f64 {
        self.drafting.last_ms()
    }
}
