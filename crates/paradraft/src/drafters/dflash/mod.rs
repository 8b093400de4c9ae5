//! DFlash (Chen et al., "DFlash: Block Diffusion for Flash Speculative Decoding"): a few-layer
//! block-diffusion drafter conditioned on the target's hidden states.
//!
//! - §3.1 architecture, §3.2 KV injection → [`model`]: fused taps become each draft layer's
//!   context K/V, kept across rounds; the block [bonus, MASK × (B − 1)] attends non-causally
//!   over [context ⧺ block]; slot k predicts position s + k.
//! - §3.2 one round → [`Dflash`] (this file): one draft pass proposes a chain of B − 1 tokens,
//!   which the core verifies in one target pass.
//! - §3.3 training → `crate::train::dflash`.
//! - DFlash-tree (a hybrid): the block's per-slot distributions searched into a tree with
//!   DART's continuity-aware pruning (`crate::speculative::tree_search`), optionally n-gram scored.
//!
//! The embedding and LM head are the target's, frozen and shared. The mask slots use a frozen
//! target embedding row (`dflash_config.mask_token_id`), as the published Qwen3 drafters do.

pub mod config;
pub mod model;

pub use config::{default_target_layers, DflashConfig};
pub use model::DflashModel;

use crate::drafters::parts::{BlockDrafter, BlockDrafting, DraftHead, Selection};
use crate::drafters::registry::{LoadArgs, LoadedMethod, MethodEntry, Mode, Template};
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::Model;
use crate::sample::SamplingParams;
use crate::speculative::{DraftTree, Drafter, Hidden, Outcome};
use crate::types::{Pos, TokenId};
use std::sync::Arc;

/// Target positions whose states a request's drafter holds before injecting them unasked.
const PENDING_ROWS: usize = 512;

pub static METHOD: MethodEntry = MethodEntry {
    name: "dflash",
    about: "DFlash block-diffusion drafter (greedy block; one-hot q at T > 0)",
    modes: &[Mode::Greedy, Mode::Sample, Mode::Tree, Mode::Cps],
    options: &[
        ("model", None),
        ("block_size", None),
        ("ngram", Some(Mode::Tree)),
        ("no_ngram", Some(Mode::Tree)),
        ("ngram_arpa", Some(Mode::Cps)),
    ],
    default_dir: Some("smollm2-135m-dflash"),
    load,
    label: None,
    prefetch: None,
};

fn load<'t>(a: &LoadArgs<'_, 't>) -> Result<LoadedMethod<'t>> {
    let m = DflashModel::load(&a.dir).map_err(a.loading("DFlash drafter"))?;
    let d = Dflash::new(m, &a.lm.model, a.ctx, a.cfg.block_size, Default::default())?
        .with_selection(a.selection()?);
    let max_draft = a.max_draft(d.block_size - 1);
    Ok(LoadedMethod {
        template: Box::new(d),
        max_draft,
    })
}

impl<'t> Template<'t> for Dflash<'t> {
    fn fork(&self, ctx: usize, sampling: SamplingParams) -> Result<Box<dyn Drafter + 't>> {
        Ok(Box::new(Dflash::fork(self, ctx, sampling)?))
    }
    fn taps(&self) -> Vec<usize> {
        Drafter::taps(self).to_vec()
    }
    fn kv_bytes_per_slot(&self) -> usize {
        self.kv.bytes_per_slot()
    }

    /// At most [`PENDING_ROWS`], and one round's positions more while they are injected.
    fn pending_bytes(&self, ctx: usize) -> usize {
        let width = self.model.config.target_layer_ids.len() * self.target.config.hidden_size;
        (PENDING_ROWS + crate::speculative::ROUND_POSITIONS).min(ctx)
            * width
            * std::mem::size_of::<f32>()
    }
}

impl BlockDrafter for Dflash<'_> {
    fn drafting_mut(&mut self) -> &mut BlockDrafting {
        &mut self.drafting
    }
}

/// A DFlash drafter bound to its target (whose embedding and LM head it uses).
pub struct Dflash<'t> {
    /// The weights, shared by every request's drafter.
    model: Arc<DflashModel>,
    target: &'t Model,
    /// The target's head over the draft vocabulary.
    head: DraftHead,
    kv: KvCache,
    s: model::Scratch,
    /// Block size used at run time (≤ any value; the trained one is typical).
    pub block_size: usize,
    /// How the block becomes a draft (argmax, sampled or CPS chain, or a searched tree).
    drafting: BlockDrafting,
    /// Target states of committed positions not yet injected: they enter the context when
    /// the next block is drafted, all in one pass (rounds that draft nothing cost nothing).
    pending: Vec<f32>,
    x: Vec<f32>,
    hidden: Vec<f32>,
    logits: Vec<f32>,
    positions: Vec<Pos>,
}

impl<'t> Dflash<'t> {
    /// `ctx`: the target's KV capacity. `sampling`: the target's sampler settings.
    pub fn new(
        model: impl Into<Arc<DflashModel>>,
        target: &'t Model,
        ctx: usize,
        block_size: Option<usize>,
        sampling: SamplingParams,
    ) -> Result<Self> {
        let model = model.into();
        model.config.check_target(&target.config)?;
        let block_size = block_size.unwrap_or(model.config.block_size);
        if block_size < 2 {
            return Err(Error::BadRequest(format!(
                "DFlash block size {block_size} must be at least 2"
            )));
        }
        let head = DraftHead::of_target(target, model.vocab.clone());
        let kv = model.new_kv(ctx + block_size);
        Ok(Dflash {
            model,
            target,
            head,
            kv,
            s: model::Scratch::default(),
            block_size,
            drafting: BlockDrafting::new(sampling, Selection::Greedy)?,
            pending: vec![],
            x: vec![],
            hidden: vec![],
            logits: vec![],
            positions: vec![],
        })
    }

    /// A drafter for another request: the same weights, head and settings, its own context
    /// (`ctx` target positions) and the request's sampling.
    pub fn fork(&self, ctx: usize, sampling: SamplingParams) -> Result<Self> {
        Ok(Dflash {
            model: self.model.clone(),
            target: self.target,
            head: self.head.fork(),
            kv: self.model.new_kv(ctx + self.block_size),
            s: model::Scratch::default(),
            block_size: self.block_size,
            drafting: self.drafting.fork(sampling)?,
            pending: vec![],
            x: vec![],
            hidden: vec![],
            logits: vec![],
            positions: vec![],
        })
    }

    /// Committed positions whose target states wait to be injected.
    pub fn pending_positions(&self) -> usize {
        let width = self.model.config.target_layer_ids.len() * self.target.config.hidden_size;
        self.pending.len() / width.max(1)
    }

    pub fn config(&self) -> &DflashConfig {
        &self.model.config
    }

    fn add_context(&mut self, hidden: Hidden) -> Result<()> {
        let n = hidden.rows.len() / hidden.width.max(1);
        let p0 = self.kv.len() as u32;
        self.positions.clear();
        self.positions.extend((0..n as u32).map(|i| Pos(p0 + i)));
        self.model
            .add_context(&mut self.kv, hidden.rows, &self.positions, &mut self.s)
    }
}

impl Drafter for Dflash<'_> {
    fn name(&self) -> &str {
        if self.drafting.is_tree() {
            "dflash-tree"
        } else {
            "dflash"
        }
    }

    fn taps(&self) -> &[usize] {
        &self.model.config.target_layer_ids
    }

    fn begin(&mut self, _prompt: &[TokenId], hidden: Hidden) -> Result<()> {
        self.kv.clear();
        self.pending.clear();
        self.add_context(hidden)
    }

    fn propose(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<DraftTree> {
        let s = committed.len() - 1; // the root (bonus token) sits at position s
        let width = self.model.config.target_layer_ids.len() * self.target.config.hidden_size;
        let held = self.kv.len() + self.pending.len() / width.max(1);
        if held != s {
            return Err(Error::BadRequest(format!(
                "DFlash context holds {held} positions but the root is at {s}"
            )));
        }
        let room = self.kv.capacity().saturating_sub(s);
        let b = self.block_size.min(max_nodes + 1).min(room);
        if b < 2 {
            return Ok(DraftTree::new());
        }
        if !self.pending.is_empty() {
            let rows = std::mem::take(&mut self.pending);
            self.add_context(Hidden { width, rows: &rows })?;
            self.pending = rows;
            self.pending.clear();
        }
        let h = self.target.config.hidden_size;
        // Block input: [root, MASK × (b − 1)] embedded with the target's embedding.
        self.x.resize(b * h, 0.0);
        self.target.embed_row(committed[s].idx(), &mut self.x[..h]);
        let mask = self.model.config.mask_token_id as usize;
        self.target.embed_row(mask, &mut self.x[h..2 * h]);
        for i in 2..b {
            self.x.copy_within(h..2 * h, i * h);
        }
        self.positions.clear();
        self.positions.extend((s..s + b).map(|p| Pos(p as u32)));
        self.model.block_forward(
            &mut self.kv,
            &self.x,
            &self.positions,
            &mut self.s,
            &mut self.hidden,
        )?;
        // Slots 1..b predict positions s+1..s+b−1 through the target's (or reduced) LM head.
        let v = self
            .head
            .logits(self.target, &self.hidden[h..b * h], &mut self.logits);
        self.drafting.draft(
            &self.logits[..(b - 1) * v],
            v,
            &self.head,
            committed,
            s + 1,
            max_nodes,
        )
    }

    /// The round's target states wait for the next proposal, which injects them; past
    /// [`PENDING_ROWS`] positions (rounds that asked for no node: held drafting, or `auto` not
    /// asking its model) they are injected now, so that a request's pending states stay
    /// bounded.
    fn observe(&mut self, _outcome: &Outcome, hidden: Hidden) -> Result<()> {
        self.pending.extend_from_slice(hidden.rows);
        let width = hidden.width.max(1);
        if self.pending.len() / width > PENDING_ROWS {
            let rows = std::mem::take(&mut self.pending);
            let fed = self.add_context(Hidden { width, rows: &rows });
            self.pending = rows;
            self.pending.clear();
            fed?;
        }
        Ok(())
    }

    fn node_confidence(&self) -> Option<&[f32]> {
        self.drafting.node_confidence()
    }

    fn selection_ms(&self) -> f64 {
        self.drafting.last_ms()
    }
}
