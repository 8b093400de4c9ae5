//! PARD (An et al., "PARD: Accelerating LLM Inference with Low-Cost PARallel Draft Model
//! Adaptation"): a small causal LM of the target's family that drafts K tokens in ONE pass by
//! appending K − 1 mask tokens to the committed text.
//!
//! - §3.1 / docs/pard.md → [`MaskLm`] (shared with DiffuSpec's drafter): the drafter is an
//!   ordinary causal LM run by the engine's own `Model` (the same forward code as every target,
//!   so it batches alike). The published `amd/PARD-*` directories (a plain HF causal LM plus
//!   `pard_token`) load unchanged; the mask id is resolved in the engine-wide order
//!   (`mask_lm::mask_token_id`). A compact
//!   layout of ours keeps only the decoder layers and the final norm (f16) and takes the
//!   embedding and the tied LM head from the target (`Overlay`): the SmolLM2 drafter, whose
//!   layers are the target's first N fine-tuned, ships in tens of MB instead of the 56 MB
//!   embedding. Its mask token is a rare special token whose embedding row stays the target's
//!   (the vocabulary both share is untouched; the layers learn to read it as a mask).
//! - docs/pard.md one round → [`Pard::propose`]: input `[committed tokens not yet in the drafter's
//!   cache, MASK × (K − 1)]`, AR-shifted outputs (the last real slot predicts the next token,
//!   mask k the k-th after it), the mask entries dropped from the cache afterwards; K at run
//!   time is free (the paper's best is K 12 from K 8 in training).
//! - §3.2 training with conditional drop-token (COD) → `crate::train::pard`.
//!
//! The block becomes a chain of argmaxes, a chain sampled from each slot's q (T > 0,
//! `Selection::Sample`), or a DART-searched tree — the same [`BlockDrafting`] DFlash uses.

use crate::drafters::mask_lm::{Attend, MaskLm, MaskLmRun};
use crate::drafters::parts::{BlockDrafter, BlockDrafting, Selection};
use crate::drafters::registry::{LoadArgs, LoadedMethod, MethodEntry, Mode, Template};
use crate::error::{Error, Result};
use crate::sample::SamplingParams;
use crate::speculative::{DraftTree, Drafter, Hidden, Outcome};
use crate::types::TokenId;
use std::sync::Arc;

/// One request's PARD drafter.
pub struct Pard {
    run: MaskLmRun,
    /// Draft tokens per round (K at run time).
    pub k: usize,
    /// Chain (argmax, sampled or CPS) or searched tree.
    drafting: BlockDrafting,
    masks: Vec<TokenId>,
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
        Ok(Pard {
            run: MaskLmRun::new(model, ctx, k),
            k,
            drafting: BlockDrafting::new(sampling, Selection::Greedy)?,
            masks: vec![],
            logits: vec![],
        })
    }

    /// A drafter for another request: the same weights and settings, its own cache (`ctx`
    /// target positions) and sampling.
    pub fn fork(&self, ctx: usize, sampling: SamplingParams) -> Result<Self> {
        Ok(Pard {
            drafting: self.drafting.fork(sampling)?,
            ..Pard::new(self.run.model.clone(), ctx, self.k, sampling)?
        })
    }

    /// The last proposal's block: one row of draft-vocabulary logits per slot (the root's, then
    /// each mask's), and the row width.
    pub fn block_logits(&self) -> (&[f32], usize) {
        (&self.logits, self.run.head.vocab.len())
    }
}

pub static METHOD: MethodEntry = MethodEntry {
    name: "pard",
    about: "PARD: target-independent mask-token draft model, K drafts in one pass (greedy chain)",
    modes: &[Mode::Greedy, Mode::Sample, Mode::Tree, Mode::Cps],
    options: &[
        ("model", None),
        ("ngram", Some(Mode::Tree)),
        ("no_ngram", Some(Mode::Tree)),
        ("ngram_arpa", Some(Mode::Cps)),
    ],
    default_dir: Some("smollm2-135m-pard"),
    load,
    label: None,
    prefetch: None,
};

fn load<'t>(a: &LoadArgs<'_, 't>) -> Result<LoadedMethod<'t>> {
    let m = MaskLm::load(&a.dir, a.target_path, a.lm, "PARD").map_err(a.loading("PARD drafter"))?;
    let k = a.cfg.num_speculative_tokens;
    let d = Pard::new(m, a.ctx, k, Default::default())?.with_selection(a.selection()?);
    Ok(LoadedMethod {
        template: Box::new(d),
        max_draft: a.max_draft(k),
    })
}

impl<'t> Template<'t> for Pard {
    fn fork(&self, ctx: usize, sampling: SamplingParams) -> Result<Box<dyn Drafter + 't>> {
        Ok(Box::new(Pard::fork(self, ctx, sampling)?))
    }
    fn kv_bytes_per_slot(&self) -> usize {
        self.run.kv_bytes_per_slot()
    }
}

impl BlockDrafter for Pard {
    fn drafting_mut(&mut self) -> &mut BlockDrafting {
        &mut self.drafting
    }
}

impl Drafter for Pard {
    fn name(&self) -> &str {
        if self.drafting.is_tree() {
            "pard-tree"
        } else {
            "pard"
        }
    }

    /// The drafter's prefill: every prompt token but the last (which each round re-runs, its
    /// output predicting the first draft).
    fn begin(&mut self, prompt: &[TokenId], _hidden: Hidden) -> Result<()> {
        self.run.begin(prompt)
    }

    fn propose(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<DraftTree> {
        let n = committed.len();
        let k = self.k.min(max_nodes).min(self.run.room(n));
        if k == 0 || n == 0 {
            return Ok(DraftTree::new());
        }
        // [new committed tokens, MASK × (k − 1)] at consecutive positions, causal; the last k
        // rows (the root's and the masks') are the block. The masks leave the cache.
        let keep = self.run.reuse(committed);
        self.masks.clear();
        self.masks
            .extend(std::iter::repeat_n(self.run.model.mask, k - 1));
        let m = n - keep + k - 1;
        let v = self.run.pass(
            committed,
            keep,
            &self.masks,
            Attend::Causal,
            m - k..m,
            &mut self.logits,
        )?;
        self.drafting
            .draft(&self.logits, v, &self.run.head, committed, n, max_nodes)
    }

    fn observe(&mut self, _outcome: &Outcome, _hidden: Hidden) -> Result<()> {
        // `propose` reconciles the cache with the committed tokens it is given next round.
        Ok(())
    }

    fn node_confidence(&self) -> Option<&[f32]> {
        self.drafting.node_confidence()
    }

    fn selection_ms(&self) -> f64 {
        self.drafting.last_ms()
    }
}
