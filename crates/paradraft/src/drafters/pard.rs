//! PARD (An et al., "PARD: Accelerating LLM Inference with Low-Cost PARallel Draft Model
//! Adaptation"): a small causal LM of the target's family that drafts K tokens in ONE pass by
//! appending K − 1 mask tokens to the committed text.
//!
//! - §3.1 / spec §5.1, §5.6 → [`PardModel`]: the drafter is an ordinary causal LM run by the
//!   engine's own [`Model`] (the same forward code as every target, so it batches alike). The
//!   published `amd/PARD-*` directories (a plain HF causal LM plus `pard_token`) load
//!   unchanged; the mask id is resolved in the engine-wide order ([`mask_token_id`]). A compact
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

use crate::drafters::parts::{BlockDrafting, DraftHead};
use crate::drafters::vocab::DraftVocab;
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::source::{self, Overlay, SafetensorsSource, TensorSource};
use crate::model::{hf_config, read_config_json, Batch, Logits, Model, OutputSpec, Rows, Scratch};
use crate::runtime::ops;
use crate::sample::SamplingParams;
use crate::speculative::{DraftTree, Drafter, Hidden, Outcome};
use crate::types::{Pos, TokenId};
use std::path::Path;
use std::sync::Arc;

/// The mask token id of a parallel drafter's `config.json`, in the engine-wide order
/// `dflash_config.mask_token_id` → `mask_token_id` → `pard_token` → `ptd_token_id`; `None` when
/// none is there, an error when one is not a non-negative integer.
pub fn mask_token_id(v: &serde_json::Value) -> std::result::Result<Option<u32>, String> {
    for (key, x) in [
        (
            "dflash_config.mask_token_id",
            &v["dflash_config"]["mask_token_id"],
        ),
        ("mask_token_id", &v["mask_token_id"]),
        ("pard_token", &v["pard_token"]),
        ("ptd_token_id", &v["ptd_token_id"]),
    ] {
        if x.is_null() {
            continue;
        }
        return match x.as_u64() {
            Some(id) if id <= u32::MAX as u64 => Ok(Some(id as u32)),
            _ => Err(format!("{key} is {x}, not a token id")),
        };
    }
    Ok(None)
}

/// A PARD drafter's weights: shared by every request.
pub struct PardModel {
    pub model: Model,
    pub mask: TokenId,
    /// The vocabulary its head scores (the full one for published checkpoints).
    pub vocab: DraftVocab,
    /// K it was trained with (`pard_k`), when recorded.
    pub trained_k: Option<usize>,
    /// Whether the embedding and LM head are the target's (the compact layout).
    pub shares_target_embedding: bool,
}

impl PardModel {
    /// Loads the drafter in `dir` for the target `target` (loaded from `target_path`): a
    /// published HF directory, or the compact layout whose missing embedding comes from the
    /// target. Refused with the reason: no mask id, a mask id outside the vocabulary, another
    /// vocabulary or tokenizer, broken files.
    pub fn load(dir: &Path, target_path: &Path, target: &crate::model::Loaded) -> Result<Self> {
        Self::load_with(dir, target_path, target, true)
    }

    /// [`PardModel::load`], with dense matrices kept as stored (`quantize` false: the f32
    /// reference path) or converted to Q8_0 for the int8 kernels.
    pub fn load_with(
        dir: &Path,
        target_path: &Path,
        target: &crate::model::Loaded,
        quantize: bool,
    ) -> Result<Self> {
        let (v, cp) = read_config_json(dir, "PARD config.json")?;
        let bad = |reason: String| Error::BadModelFile {
            path: cp.clone(),
            format: "PARD config.json",
            reason,
        };
        let mut config = hf_config(&v, &cp)?;
        let tc = &target.model.config;
        let mask = mask_token_id(&v)
            .map_err(bad)?
            .ok_or_else(|| bad("no mask token id (pard_token or mask_token_id)".into()))?;
        if mask as usize >= config.vocab_size {
            return Err(bad(format!(
                "mask token {mask} is outside the vocabulary ({})",
                config.vocab_size
            )));
        }
        let misfit =
            |m: String| Error::BadRequest(format!("PARD drafter does not fit the target: {m}"));
        if config.vocab_size != tc.vocab_size {
            return Err(misfit(format!(
                "vocabulary {} ≠ the target's {}",
                config.vocab_size, tc.vocab_size
            )));
        }
        if dir.join("tokenizer.json").exists() {
            let tok = crate::model::tokenizer::Tokenizer::from_hf_dir(dir, &v)?;
            if tok.fingerprint() != target.tokenizer.fingerprint() {
                return Err(misfit("its tokenizer differs from the target's".into()));
            }
        }
        let own = SafetensorsSource::open(dir)?;
        let shares = !own.has("token_embd.weight");
        if shares && config.hidden_size != tc.hidden_size {
            return Err(misfit(format!(
                "it has no embedding of its own and its hidden size {} ≠ the target's {}",
                config.hidden_size, tc.hidden_size
            )));
        }
        let base = source::open(target_path)?;
        let src = Overlay {
            top: &own,
            base: base.as_ref(),
        };
        // Without a head of its own the drafter scores with its (or the target's) embedding.
        config.tie_embeddings = config.tie_embeddings || !own.has("output.weight");
        if shares && !config.tie_embeddings {
            return Err(bad(
                "a drafter without an embedding must tie its LM head to it".into(),
            ));
        }
        let mut model = Model::from_source(config, &src)?;
        if quantize {
            model.quantize_dense_q8_0();
        } else {
            model.set_exact(true);
        }
        let size = v["draft_vocab_size"].as_u64().map(|n| n as usize);
        let vocab = DraftVocab::load(&own, size, tc.vocab_size, "PARD drafter")?;
        Ok(PardModel {
            model,
            mask: TokenId(mask),
            vocab,
            trained_k: v["pard_k"].as_u64().map(|k| k as usize),
            shares_target_embedding: shares,
        })
    }
}

/// One request's PARD drafter.
pub struct Pard {
    model: Arc<PardModel>,
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
        model: impl Into<Arc<PardModel>>,
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
        // Keep the cache of the committed prefix it agrees on, minus the root, which runs again.
        let keep = self
            .done
            .iter()
            .zip(committed)
            .take_while(|(a, b)| a == b)
            .count()
            .min(n.saturating_sub(1));
        self.kv.truncate(keep);
        self.done.truncate(keep);
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
        let c = &self.model.model.config;
        let h = c.hidden_size;
        let rows = &out.hidden[(self.tokens.len() - k) * h..];
        self.normed.resize(k * h, 0.0);
        for (src, dst) in rows.chunks_exact(h).zip(self.normed.chunks_exact_mut(h)) {
            ops::rms_norm(src, self.model.model.output_norm(), c.rms_eps, dst);
        }
        let v = self
            .head
            .logits(&self.model.model, &self.normed, &mut self.logits);
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
}
