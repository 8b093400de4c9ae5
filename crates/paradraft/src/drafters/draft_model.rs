//! Vanilla speculative sampling with a draft model (Leviathan et al., Chen et al.): any model
//! sharing the target's tokenizer, including a layer-truncated copy of the target
//! (self-speculative drafting). The drafter runs K autoregressive steps per round on its own KV
//! cache, which it keeps in step with the committed tokens.

use crate::drafters::registry::DrafterConfig;
use crate::drafters::registry::{LoadArgs, LoadedMethod, MethodEntry, Mode, Template};
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::{Batch, Model, OutputSpec, Scratch};
use crate::sample::{Sampler, SamplingParams};
use crate::speculative::{DraftTree, Drafter, Hidden, Outcome};
use crate::types::{Pos, TokenId};
use std::sync::Arc;

pub struct DraftModel {
    /// The weights, shared by every request's drafter.
    model: Arc<Model>,
    kv: KvCache,
    scratch: Scratch,
    sampler: Sampler,
    /// Tokens proposed per round.
    pub draft_len: usize,
    /// Committed tokens whose K/V are in `kv`.
    done: Vec<TokenId>,
    /// The last proposal (to keep the K/V of its accepted part).
    proposed: Vec<TokenId>,
}

impl DraftModel {
    /// `sampling` is the target's: at temperature 0 drafts are argmaxes; otherwise they are
    /// sampled from the draft model's distribution q (attached) with the target's keyed noise
    /// for their position, so a q close to p proposes the target's own sample.
    pub fn new(
        model: impl Into<Arc<Model>>,
        target_vocab: usize,
        ctx: usize,
        draft_len: usize,
        sampling: SamplingParams,
    ) -> Result<Self> {
        let model = model.into();
        if model.config.vocab_size != target_vocab {
            return Err(Error::BadRequest(format!(
                "draft model vocabulary ({}) differs from the target's ({target_vocab})",
                model.config.vocab_size
            )));
        }
        let kv = model.new_kv(ctx);
        Ok(DraftModel {
            model,
            kv,
            scratch: Scratch::default(),
            // The target's seed: drafts use the noise the target samples with (coupling).
            sampler: Sampler::new(sampling)?,
            draft_len,
            done: vec![],
            proposed: vec![],
        })
    }
}

impl DraftModel {
    /// A drafter for another request: the same weights, its own cache and sampling.
    pub fn fork(&self, ctx: usize, sampling: SamplingParams) -> Result<Self> {
        Ok(DraftModel {
            model: self.model.clone(),
            kv: self.model.new_kv(ctx),
            scratch: Scratch::default(),
            sampler: Sampler::new(sampling)?,
            draft_len: self.draft_len,
            done: vec![],
            proposed: vec![],
        })
    }
}

impl<'t> Template<'t> for DraftModel {
    fn fork(&self, ctx: usize, sampling: SamplingParams) -> Result<Box<dyn Drafter + 't>> {
        Ok(Box::new(DraftModel::fork(self, ctx, sampling)?))
    }
    fn kv_bytes_per_slot(&self) -> usize {
        self.kv.bytes_per_slot()
    }
}

pub static METHOD: MethodEntry = MethodEntry {
    name: "draft-model",
    about: "a draft model sharing the tokenizer, or the target's first --draft-layers layers",
    modes: &[Mode::Greedy],
    options: &[("model", None), ("draft_layers", None)],
    default_dir: None,
    load,
    label: Some(label),
    prefetch: None,
};

fn load<'t>(a: &LoadArgs<'_, 't>) -> Result<LoadedMethod<'t>> {
    let draft = match (&a.cfg.draft_model, a.cfg.draft_layers) {
        (Some(p), layers) => crate::model::load_truncated(p, layers)
            .map_err(|e| e.context(format!("loading draft model {}", p.display())))?,
        (None, Some(n)) => crate::model::load_truncated(a.target_path, Some(n))?,
        (None, None) => {
            return Err(Error::BadRequest(
                "--drafter draft-model needs --draft-model PATH or --draft-layers N".into(),
            ))
        }
    };
    let k = a.cfg.num_speculative_tokens;
    let vocab = a.lm.model.config.vocab_size;
    let d = DraftModel::new(draft.model, vocab, a.ctx, k, Default::default())?;
    Ok(LoadedMethod {
        template: Box::new(d),
        max_draft: k,
    })
}

/// `draft:FILE` for a draft model, `self-draft-NL` for the target's first N layers.
fn label(c: &DrafterConfig) -> String {
    match (&c.draft_model, c.draft_layers) {
        (Some(p), _) => format!(
            "draft:{}",
            p.file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default()
        ),
        (None, Some(n)) => format!("self-draft-{n}L"),
        (None, None) => "draft-model".into(),
    }
}

impl Drafter for DraftModel {
    fn name(&self) -> &str {
        "draft-model"
    }

    /// The drafter's prefill: the prompt enters the draft model's cache now, so the first
    /// round drafts from the root alone.
    fn begin(&mut self, prompt: &[TokenId], _hidden: Hidden) -> Result<()> {
        self.kv.clear();
        self.done.clear();
        self.proposed.clear();
        if prompt.is_empty() {
            return Ok(());
        }
        let pos: Vec<Pos> = (0..prompt.len()).map(|p| Pos(p as u32)).collect();
        let spec = OutputSpec {
            rows: crate::model::Rows::Last,
            logits: crate::model::Logits::None,
            taps: vec![],
        };
        self.model.forward(
            &mut self.kv,
            &Batch {
                tokens: prompt,
                positions: &pos,
                mask: None,
            },
            &spec,
            &mut self.scratch,
        )?;
        self.done.extend_from_slice(prompt);
        Ok(())
    }

    fn propose(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<DraftTree> {
        // Drop K/V of tokens that are no longer committed, then catch up.
        // The last committed token always runs again (its logits start the chain), so a
        // proposal repeated for the same committed tokens works too.
        let keep = self
            .done
            .iter()
            .zip(committed)
            .take_while(|(a, b)| a == b)
            .count()
            .min(committed.len().saturating_sub(1));
        self.kv.truncate(keep);
        self.done.truncate(keep);
        let k = self
            .draft_len
            .min(max_nodes)
            .min(self.kv.capacity().saturating_sub(committed.len() + 1));
        if k == 0 {
            return Ok(DraftTree::new());
        }
        let spec = OutputSpec::last_full();
        let new = &committed[keep..];
        let pos: Vec<Pos> = (keep..committed.len()).map(|p| Pos(p as u32)).collect();
        let mut logits = self
            .model
            .forward(
                &mut self.kv,
                &Batch {
                    tokens: new,
                    positions: &pos,
                    mask: None,
                },
                &spec,
                &mut self.scratch,
            )?
            .logits_row(0)
            .to_vec();
        self.done.extend_from_slice(new);
        let mut tree = DraftTree::new();
        let mut parent = None;
        self.proposed.clear();
        for i in 0..k {
            let greedy = self.sampler.params.is_greedy();
            let q = self.sampler.dist(&logits);
            let x = self.sampler.sample_at(&logits, committed.len() + i);
            parent = Some(tree.push(parent, x, (!greedy).then_some(q))?);
            self.proposed.push(x);
            if i + 1 < k {
                let p = [Pos(self.kv.len() as u32)];
                logits = self
                    .model
                    .forward(
                        &mut self.kv,
                        &Batch {
                            tokens: &[x],
                            positions: &p,
                            mask: None,
                        },
                        &spec,
                        &mut self.scratch,
                    )?
                    .logits_row(0)
                    .to_vec();
                self.done.push(x);
            }
        }
        Ok(tree)
    }

    fn observe(&mut self, _outcome: &Outcome, _hidden: Hidden) -> Result<()> {
        // `propose` reconciles the cache with the committed tokens it is given next round.
        Ok(())
    }
}
