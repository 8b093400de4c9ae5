//! DiffuSpec (Li et al., "DiffuSpec: Unlocking Diffusion Language Models for Speculative
//! Decoding"): a diffusion LM drafts a whole block of k tokens by denoising `prefix ⧺ MASK^k`,
//! causal-consistency path search (CPS) picks the chain the verifier is likeliest to accept,
//! and adaptive draft length (ADL) sizes each round.
//!
//! - §4.1 / docs/diffuspec.md drafter → [`DiffuSpec`] over a [`MaskLm`]: the mask-token LM shared with
//!   PARD (the engine's own `Model`), Dream's shifted logits (the output at position p − 1
//!   predicts slot p: the root predicts slot 1, block row j slot j + 2). S refinement steps,
//!   each fixing the most confident ⌈|Ω|/(S − s + 1)⌉ open slots to their argmax (eq. 4; S = 1
//!   by default, one pass). Two modes ([`DlmMode`]):
//!   - *faithful*: every step re-encodes `prefix ⧺ y` with full attention (Dream's inference;
//!     nothing cached, a step costs a pass over the whole prefix);
//!   - *fast* (block diffusion): the prefix causal and KV-cached, the block bidirectional over
//!     itself and the prefix, so a step costs one pass over the new tokens and the block (the
//!     attention `paradraft train dlm` trains).
//! - §4.2–4.3 lattice and CPS → `crate::speculative::cps` through [`BlockDrafting`]'s
//!   `cps` (the per-slot logits of the final step; a slot fixed at an earlier step keeps that
//!   step's logits). Without CPS the draft is the raw per-slot argmax chain.
//! - §4.4 the 3-gram proxy → `crate::ngram::arpa`; §4.5 ADL → `crate::speculative::sizing`.
//! - §4.6 verification: greedy chain verification (lossless by token identity); at T > 0 the
//!   CPS path is a deterministic function of the context, verified with a one-hot q — the
//!   paper's L2R proxy q (eq. 5) is not a distribution the CPS path is drawn from, so it is not
//!   used (`docs/diffuspec.md`).

pub use crate::drafters::mask_lm::DlmMode;
use crate::drafters::mask_lm::{Attend, DlmAttention, MaskLm, MaskLmRun};
use crate::drafters::parts::{BlockDrafter, BlockDrafting, Selection};
use crate::drafters::registry::{LoadArgs, LoadedMethod, MethodEntry, Mode, Template};
use crate::error::{Error, Result};
use crate::runtime::ops;
use crate::sample::SamplingParams;
use crate::speculative::{DraftTree, Drafter, Hidden, Outcome};
use crate::types::TokenId;
use std::sync::Arc;

/// One request's DiffuSpec drafter.
pub struct DiffuSpec {
    run: MaskLmRun,
    /// Block length k: slots denoised per round (the draft is at most k long).
    pub k: usize,
    /// Refinement steps S (1 ..= k).
    pub steps: usize,
    /// Fast or faithful (never `Auto`: resolved at construction).
    pub mode: DlmMode,
    /// CPS (`Selection::Cps`), or the raw argmax chain.
    drafting: BlockDrafting,
    step_logits: Vec<f32>,
    /// The final per-slot logits (`k × vocab`).
    logits: Vec<f32>,
}

impl DiffuSpec {
    /// `ctx`: the target's KV capacity; `k`: block length; `steps`: S.
    pub fn new(
        model: impl Into<Arc<MaskLm>>,
        ctx: usize,
        k: usize,
        steps: usize,
        mode: DlmMode,
        sampling: SamplingParams,
    ) -> Result<Self> {
        let model = model.into();
        if k == 0 || k >= ctx {
            return Err(Error::BadRequest(format!(
                "DiffuSpec block length ({k}) must be between 1 and the context ({ctx} tokens) minus one"
            )));
        }
        if steps == 0 || steps > k {
            return Err(Error::BadRequest(format!(
                "DiffuSpec refinement steps ({steps}) must be between 1 and the block length ({k})"
            )));
        }
        let mode = match (mode, model.diffusion) {
            (DlmMode::Auto, Some((DlmAttention::Full, _))) => DlmMode::Faithful,
            (DlmMode::Auto, _) => DlmMode::Fast,
            (m, _) => m,
        };
        Ok(DiffuSpec {
            run: MaskLmRun::new(model, ctx, k),
            k,
            steps,
            mode,
            drafting: BlockDrafting::new(sampling, Selection::Greedy)?,
            step_logits: vec![],
            logits: vec![],
        })
    }

    /// A drafter for another request: the same weights and settings, its own cache and
    /// sampling.
    pub fn fork(&self, ctx: usize, sampling: SamplingParams) -> Result<Self> {
        let d = DiffuSpec::new(
            self.run.model.clone(),
            ctx,
            self.k,
            self.steps,
            self.mode,
            sampling,
        )?;
        Ok(DiffuSpec {
            drafting: self.drafting.fork(sampling)?,
            ..d
        })
    }

    /// The last proposal's final block: one row of draft-vocabulary logits per slot, and the
    /// row width.
    pub fn block_logits(&self) -> (&[f32], usize) {
        (&self.logits, self.run.head.vocab.len())
    }

    /// Denoises the k slots after `committed` in S steps; the final per-slot logits land in
    /// `logits`. Returns the vocabulary size.
    fn denoise(&mut self, committed: &[TokenId], k: usize) -> Result<usize> {
        let n = committed.len();
        let mut y = vec![self.run.model.mask; k];
        let mut open: Vec<usize> = (0..k).collect();
        let mut v = 0;
        let mut root_row = vec![];
        let faithful = self.mode == DlmMode::Faithful;
        for s in 0..self.steps {
            // Outputs at positions n−1 ..= n+k−2 predict slots 1..=k.
            let out = &mut self.step_logits;
            if faithful {
                // Nothing is cached: a full-attention prefix is no causal one to reuse.
                self.run.clear();
                v = self
                    .run
                    .pass(committed, 0, &y, Attend::Full, n - 1..n - 1 + k, out)?;
                self.run.clear();
            } else if s == 0 {
                let keep = self.run.reuse(committed);
                let r = n - keep;
                v = self
                    .run
                    .pass(committed, keep, &y, Attend::Block, r - 1..r - 1 + k, out)?;
            } else {
                // The root is cached and causal: slot 1's row stays; the block reruns.
                v = self
                    .run
                    .pass(committed, n, &y, Attend::Block, 0..k - 1, out)?;
                out.splice(0..0, root_row.iter().copied());
            }
            if s == 0 {
                self.logits.resize(k * v, 0.0);
                if self.steps > 1 && !faithful {
                    root_row = self.step_logits[..v].to_vec();
                }
            }
            if s + 1 == self.steps {
                // The last step fixes every open slot with this step's logits.
                for &i in &open {
                    self.logits[i * v..(i + 1) * v]
                        .copy_from_slice(&self.step_logits[i * v..(i + 1) * v]);
                }
                break;
            }
            // Fix the most confident ⌈|Ω| / (S − s)⌉ open slots to their argmax.
            let fix = open.len().div_ceil(self.steps - s);
            // A slot's confidence: its argmax's probability.
            let conf = |i: usize, l: &[f32]| {
                let row = &l[i * v..(i + 1) * v];
                (ops::max_value(row) - ops::log_sum_exp(row)).exp()
            };
            let mut order: Vec<(f32, usize)> = open
                .iter()
                .map(|&i| (conf(i, &self.step_logits), i))
                .collect();
            order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for &(_, i) in order.iter().take(fix) {
                let row = &self.step_logits[i * v..(i + 1) * v];
                y[i] = self.run.head.target_id(ops::argmax(row).idx());
                self.logits[i * v..(i + 1) * v].copy_from_slice(row);
            }
            let fixed: Vec<usize> = order.iter().take(fix).map(|o| o.1).collect();
            open.retain(|i| !fixed.contains(i));
        }
        Ok(v)
    }
}

pub static METHOD: MethodEntry = MethodEntry {
    name: "diffuspec",
    about: "DiffuSpec: diffusion-LM drafter + causal-consistency path search (3-gram proxy) + adaptive draft length",
    modes: &[Mode::Cps, Mode::Greedy],
    options: &[
        ("model", None),
        ("ngram_arpa", Some(Mode::Cps)),
        ("dlm_mode", None),
        ("dlm_steps", None),
    ],
    default_dir: Some("smollm2-135m-dlm"),
    load,
    label: None,
    prefetch: None,
};

fn load<'t>(a: &LoadArgs<'_, 't>) -> Result<LoadedMethod<'t>> {
    let m = MaskLm::load(&a.dir, a.target_path, a.lm, "DiffuSpec")
        .map_err(a.loading("DiffuSpec drafter"))?;
    if m.diffusion.is_none() {
        return Err(Error::BadRequest(format!(
            "{} is not a diffusion drafter (no dlm_attention, not a Dream model): use --drafter pard for PARD drafters",
            a.dir.display()
        )));
    }
    let (k, c) = (a.cfg.num_speculative_tokens, a.cfg);
    let d = DiffuSpec::new(m, a.ctx, k, c.dlm_steps, c.dlm_mode, Default::default())?
        .with_selection(a.selection()?);
    Ok(LoadedMethod {
        template: Box::new(d),
        max_draft: k,
    })
}

impl<'t> Template<'t> for DiffuSpec {
    fn fork(&self, ctx: usize, sampling: SamplingParams) -> Result<Box<dyn Drafter + 't>> {
        Ok(Box::new(DiffuSpec::fork(self, ctx, sampling)?))
    }
    fn kv_bytes_per_slot(&self) -> usize {
        self.run.kv_bytes_per_slot()
    }
}

impl BlockDrafter for DiffuSpec {
    fn drafting_mut(&mut self) -> &mut BlockDrafting {
        &mut self.drafting
    }
}

impl Drafter for DiffuSpec {
    fn name(&self) -> &str {
        "diffuspec"
    }

    /// Fast mode's prefill: every prompt token but the last (which each round re-runs, its
    /// output predicting slot 1). Faithful mode keeps nothing.
    fn begin(&mut self, prompt: &[TokenId], _hidden: Hidden) -> Result<()> {
        match self.mode {
            DlmMode::Faithful => {
                self.run.clear();
                Ok(())
            }
            _ => self.run.begin(prompt),
        }
    }

    fn propose(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<DraftTree> {
        let n = committed.len();
        let k = self.k.min(self.run.room(n));
        if k == 0 || n == 0 || max_nodes == 0 {
            return Ok(DraftTree::new());
        }
        let v = self.denoise(committed, k)?;
        self.drafting
            .draft(&self.logits, v, &self.run.head, committed, n, max_nodes)
    }

    fn observe(&mut self, _outcome: &Outcome, _hidden: Hidden) -> Result<()> {
        // `propose` reconciles the cache with the committed tokens it is given next round.
        Ok(())
    }

    fn selection_ms(&self) -> f64 {
        self.drafting.last_ms()
    }
}
