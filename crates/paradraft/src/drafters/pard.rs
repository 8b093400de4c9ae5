//! PARD (An et al., "PARD: Accelerating LLM Inference with Low-Cost PARallel Draft Model
//! Adaptation"): a small causal LM of the target's family that drafts K tokens in ONE pass by
//! appending K − 1 mask tokens to the committed text.
//!
//! - §3.1 / spec §5.1, §5.6 → [`MaskLm`] (shared with DiffuSpec's drafter): the drafter is an
//!   ordinary causal LM run by the engine's own `Model` (the same forward code as every target,
//!   so it batches alike). The published `amd/PARD-*` directories (a plain HF causal LM plus
//!   `pard_token`) load unchanged; the mask id is resolved in the engine-wide order
//!   (`mask_lm::mask_token_id`). A compact
//!   layout of ours keeps only the decoder layers and the final norm (f16) and takes the
//!   embedding and the tied LM head from the target (`Overlay`): the SmolLM2 drafter, whose
//!   layers are the target's first N fine-tuned, ships in tens of MB instead of the 56 MB
//!   embedding. Its mask token is a rare special token whose embedding row stays the target's
//!   (the vocabulary both share is untouched; the layers learn to read it as a mask).
//! - spec §5.2 one round → [`Pard::propose`]: input `[committed tokens not yet in the drafter's
//!   cache, MASK × (K − 1)]`, AR-shifted outputs (the last real slot predicts the next token,
//!   mask k the k-th after it), the mask entries dropped from the cache afterwards; K at run
//!   time is free (the paper's best is K 12 from K 8 in training).
//! - §3.2 training with conditional drop-token (COD) → `crate::train::pard`.
//!
//! The block becomes a chain of argmaxes, a chain sampled from each slot's q (T > 0,
//! `DraftSampling::Sample`), or a DART-searched tree — the same [`BlockDrafting`] DFlash uses.

use crate::drafters::mask_lm::{reuse_prefix, MaskLm};
use crate::drafters::parts::{BlockDrafting, DraftHead};
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::{Batch, Logits, OutputSpec, Rows, Scratch};
use crate::sample::SamplingParams;
use crate::speculative::{DraftTree, Drafter, Hidden, Outcome};
use crate::types::{Pos, TokenId};
use std::sync::Arc;

/// One request's PARD drafter.
pub struct Pard {
    model: Arc<MaskLm>,
    head: DraftHead,
    kv: KvCache,
    s: Scratch,
    /// Draft tokens per round (K at run time).
    pub k: usize,
    /// Chain (argmax or sampled) or searched tree.
    pub drafting: BlockDrafting,
    /// Committed tokens whose K/V are in `kv`.
    done: Vec<TokenId>,
    tokens: Vec<TokenId>,
    positions: Vec<Pos>,
    normed: Vec<f32>,
    logits: Vec<f32>,
}

impl Pard {
    /// `ctx`: the target's KV capacity; `k`: drafts per round (≥ 1).
    pub fn new(
        model: impl Into<Arc<MaskLm>>,
        ctx: usize,
        k: usize,
        sampling: SamplingParams,
    ) -> Result<Self> {
        let model = model.into();
        if k == 0 || k >= ctx {
            return Err(Error::BadRequest(format!(
                "PARD drafts per round ({k}) must be between 1 and the context ({ctx} tokens) minus one"
            )));
        }
        let head = DraftHead::of_target(&model.model, model.vocab.clone());
        let kv = model.model.new_kv(ctx + k);
        Ok(Pard {
            head,
            kv,
            s: Scratch::default(),
            k,
            drafting: BlockDrafting::new(sampling)?,
            done: vec![],
            tokens: vec![],
            positions: vec![],
            normed: vec![],
            logits: vec![],
            model,
        })
    }

    /// A drafter for another request: the same weights and settings, its own cache (`ctx`
    /// target positions) and sampling.
    pub fn fork(&self, ctx: usize, sampling: SamplingParams) -> Result<Self> {
        let mut p = Pard::new(self.model.clone(), ctx, self.k, sampling)?;
        p.drafting = self.drafting.fork(sampling)?;
        Ok(p)
    }

    /// The last proposal's block: one row of draft-vocabulary logits per slot (the root's, then
    /// each mask's), and the row width.
    pub fn block_logits(&self) -> (&[f32], usize) {
        (&self.logits, self.head.vocab.len())
    }
}

impl Drafter for Pard {
    fn name(&self) -> &str {
        if self.drafting.tree.is_some() {
            "pard-tree"
        } else {
            "pard"
        }
    }

    /// The drafter's prefill: every prompt token but the last (which each round re-runs, its
    /// output predicting the first draft).
    fn begin(&mut self, prompt: &[TokenId], _hidden: Hidden) -> Result<()> {
        self.kv.clear();
        self.done.clear();
        let n = prompt.len().saturating_sub(1);
        if n == 0 {
            return Ok(());
        }
        self.positions.clear();
        self.positions.extend((0..n as u32).map(Pos));
        let spec = OutputSpec {
            rows: Rows::Last,
            logits: Logits::None,
            taps: vec![],
        };
        let b = Batch {
            tokens: &prompt[..n],
            positions: &self.positions,
            mask: None,
        };
        self.model
            .model
            .forward(&mut self.kv, &b, &spec, &mut self.s)?;
        self.done.extend_from_slice(&prompt[..n]);
        Ok(())
    }

    fn propose(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<DraftTree> {
        let n = committed.len();
        let keep = reuse_prefix(&mut self.done, &mut self.kv, committed);
        let room = self.kv.capacity().saturating_sub(n) + 1;
        let k = self.k.min(max_nodes).min(room);
        if k == 0 || n == 0 {
            return Ok(DraftTree::new());
        }
        // [new committed tokens, MASK × (k − 1)] at consecutive positions.
        self.tokens.clear();
        self.tokens.extend_from_slice(&committed[keep..]);
        self.tokens
            .extend(std::iter::repeat_n(self.model.mask, k - 1));
        self.positions.clear();
        self.positions
            .extend((keep..keep + self.tokens.len()).map(|p| Pos(p as u32)));
        let last = self.model.model.config.n_layers - 1;
        let spec = OutputSpec {
            rows: Rows::Last,
            logits: Logits::None,
            taps: vec![last],
        };
        let b = Batch {
            tokens: &self.tokens,
            positions: &self.positions,
            mask: None,
        };
        let out = self
            .model
            .model
            .forward(&mut self.kv, &b, &spec, &mut self.s)?;
        // The last k rows (the root's and the masks') through the final norm and the head.
        let h = self.model.model.config.hidden_size;
        let rows = &out.hidden[(self.tokens.len() - k) * h..];
        let v = self
            .model
            .score(&mut self.head, rows, &mut self.normed, &mut self.logits);
        // The mask entries leave the cache; the committed ones stay.
        self.kv.truncate(n);
        self.done.extend_from_slice(&committed[keep..]);
        self.drafting
            .draft(&self.logits, v, &self.head, committed, n, max_nodes)
    }

    fn observe(&mut self, _outcome: &Outcome, _hidden: Hidden) -> Result<()> {
        // `propose` reconciles the cache with the committed tokens it is given next round.
        Ok(())
    }

    fn node_confidence(&self) -> Option<&[f32]> {
        self.drafting.node_confidence()
    }

    fn selection_ms(&self) -> f64 {
        self.drafting.last_ms
    }
}
