//! The mask-token draft LM shared by PARD (§3.1, docs/pard.md) and DiffuSpec's diffusion-LM
//! drafter (§4.1, docs/diffuspec.md): a decoder of the target's family run by the engine's own
//! [`Model`], a mask token, and a draft vocabulary. Published HF directories load unchanged
//! (PARD's `pard_token`, Dream's `model_type: "Dream"` with the mask id in
//! `generation_config.json`); the compact layout of ours keeps only the decoder layers and the
//! final norm (f16) and takes the embedding and the tied LM head from the target (`Overlay`).

use crate::drafters::parts::DraftHead;
use crate::drafters::vocab::DraftVocab;
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::source::{self, Overlay, SafetensorsSource, TensorSource};
use crate::model::{hf_config, read_config_json, Model};
use crate::model::{Batch, Logits, OutputSpec, Rows, Scratch, TreeMask};
use crate::runtime::ops;
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

/// [`mask_token_id`] of `dir`'s `config.json` (`v`), else the `mask_token_id` of its
/// `generation_config.json` (where Dream keeps it).
pub fn mask_token_id_in(
    dir: &Path,
    v: &serde_json::Value,
) -> std::result::Result<Option<u32>, String> {
    if let Some(id) = mask_token_id(v)? {
        return Ok(Some(id));
    }
    let gp = dir.join("generation_config.json");
    let Ok(text) = std::fs::read_to_string(&gp) else {
        return Ok(None);
    };
    let g: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", gp.display()))?;
    match &g["mask_token_id"] {
        serde_json::Value::Null => Ok(None),
        x => match x.as_u64() {
            Some(id) if id <= u32::MAX as u64 => Ok(Some(id as u32)),
            _ => Err(format!(
                "{}: mask_token_id is {x}, not a token id",
                gp.display()
            )),
        },
    }
}

/// How a drafting step attends over the prefix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DlmMode {
    /// The drafter's own training attention: block drafters (`dlm_attention: "block"`) run
    /// fast, full-attention ones (Dream) faithful.
    #[default]
    Auto,
    /// Prefix causal and cached; the block bidirectional.
    Fast,
    /// Re-encode `prefix ⧺ block` with full attention every step.
    Faithful,
}

impl std::str::FromStr for DlmMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(DlmMode::Auto),
            "fast" => Ok(DlmMode::Fast),
            "faithful" => Ok(DlmMode::Faithful),
            o => Err(Error::BadRequest(format!(
                "DLM mode {o:?} (known: auto, fast, faithful)"
            ))),
        }
    }
}

/// How a diffusion drafter's mask block attends (`dlm_attention` in its `config.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DlmAttention {
    /// Causal prefix, the block bidirectional over itself and the prefix (trained by
    /// `paradraft train dlm`).
    Block,
    /// Every position sees every other (Dream, DiffuLLaMA).
    Full,
}

/// A mask-token draft LM's weights: shared by every request.
pub struct MaskLm {
    pub model: Model,
    pub mask: TokenId,
    /// The vocabulary its head scores (the full one for published checkpoints).
    pub vocab: DraftVocab,
    /// K it was trained with (`pard_k`), when recorded.
    pub trained_k: Option<usize>,
    /// Whether the embedding and LM head are the target's (the compact layout).
    pub shares_target_embedding: bool,
    /// A diffusion drafter's attention and block length in training (`dlm_attention`,
    /// `dlm_block_size`; Dream: full attention); `None` for a causal (PARD) drafter.
    pub diffusion: Option<(DlmAttention, Option<usize>)>,
}

impl MaskLm {
    /// Loads the drafter (`what` names it in errors) in `dir` for the target `target`
    /// (loaded from `target_path`): a published HF directory, or the compact layout whose
    /// missing embedding comes from the target. Refused with the reason: no mask id, a mask id
    /// outside the vocabulary, another vocabulary or tokenizer, broken files.
    pub fn load(
        dir: &Path,
        target_path: &Path,
        target: &crate::model::Loaded,
        what: &'static str,
    ) -> Result<Self> {
        Self::load_with(dir, target_path, target, what, true)
    }

    /// [`MaskLm::load`], with dense matrices kept as stored (`quantize` false: the f32
    /// reference path) or converted to Q8_0 for the int8 kernels.
    pub fn load_with(
        dir: &Path,
        target_path: &Path,
        target: &crate::model::Loaded,
        what: &'static str,
        quantize: bool,
    ) -> Result<Self> {
        let format = "drafter config.json";
        let (v, cp) = read_config_json(dir, format)?;
        let bad = |reason: String| Error::BadModelFile {
            path: cp.clone(),
            format,
            reason,
        };
        let mut config = hf_config(&v, &cp)?;
        let tc = &target.model.config;
        let mask = mask_token_id_in(dir, &v).map_err(bad)?.ok_or_else(|| {
            bad(format!(
                "{what}: no mask token id (pard_token or mask_token_id, here or in generation_config.json)"
            ))
        })?;
        if mask as usize >= config.vocab_size {
            return Err(bad(format!(
                "mask token {mask} is outside the vocabulary ({})",
                config.vocab_size
            )));
        }
        let misfit =
            |m: String| Error::BadRequest(format!("{what} drafter does not fit the target: {m}"));
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
        let vocab = DraftVocab::load(&own, size, tc.vocab_size, what)?;
        let dream = v["model_type"].as_str().map(str::to_ascii_lowercase) == Some("dream".into());
        let diffusion = match (v["dlm_attention"].as_str(), dream) {
            (Some("block"), _) => Some(DlmAttention::Block),
            (Some("full"), _) | (None, true) => Some(DlmAttention::Full),
            (None, false) => None,
            (Some(o), _) => {
                return Err(bad(format!(
                    "dlm_attention {o:?} (known: \"block\", \"full\")"
                )))
            }
        };
        let block = v["dlm_block_size"].as_u64().map(|k| k as usize);
        Ok(MaskLm {
            model,
            mask: TokenId(mask),
            vocab,
            trained_k: v["pard_k"].as_u64().map(|k| k as usize).or(block),
            shares_target_embedding: shares,
            diffusion: diffusion.map(|a| (a, block)),
        })
    }
}

/// How one pass of a [`MaskLmRun`] attends: the committed tokens are always causal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attend {
    /// Everything causal (PARD's masks, each seeing the ones before it).
    Causal,
    /// The trailing block bidirectional over itself and the prefix (block diffusion).
    Block,
    /// Every position sees every other (Dream's full attention).
    Full,
}

/// One request's run of a [`MaskLm`]: its KV cache of committed tokens (all but the root,
/// which each round runs again, its output predicting the first draft) and scratch — what
/// PARD's and DiffuSpec's drafters share.
pub struct MaskLmRun {
    pub model: Arc<MaskLm>,
    pub head: DraftHead,
    kv: KvCache,
    s: Scratch,
    /// Committed tokens whose K/V are in `kv`.
    done: Vec<TokenId>,
    tokens: Vec<TokenId>,
    positions: Vec<Pos>,
    normed: Vec<f32>,
}

impl MaskLmRun {
    /// A cache for `ctx` target positions and a block of up to `block` slots beyond them.
    /// Bytes of the drafter's K/V cache per position.
    pub fn kv_bytes_per_slot(&self) -> usize {
        self.kv.bytes_per_slot()
    }

    pub fn new(model: Arc<MaskLm>, ctx: usize, block: usize) -> Self {
        MaskLmRun {
            head: DraftHead::of_target(&model.model, model.vocab.clone()),
            kv: model.model.new_kv(ctx + block),
            s: Scratch::default(),
            done: vec![],
            tokens: vec![],
            positions: vec![],
            normed: vec![],
            model,
        }
    }

    /// Slots a block after `n` committed tokens may hold.
    pub fn room(&self, n: usize) -> usize {
        self.kv.capacity().saturating_sub(n) + 1
    }

    /// Forgets every cached token.
    pub fn clear(&mut self) {
        self.kv.clear();
        self.done.clear();
    }

    /// The prompt pass: every prompt token but the last into the cache.
    pub fn begin(&mut self, prompt: &[TokenId]) -> Result<()> {
        self.clear();
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

    /// Keeps the cached prefix `committed` agrees on, minus its last token (the root): where
    /// the next [`MaskLmRun::pass`] starts.
    pub fn reuse(&mut self, committed: &[TokenId]) -> usize {
        let keep = self
            .done
            .iter()
            .zip(committed)
            .take_while(|(a, b)| a == b)
            .count()
            .min(committed.len().saturating_sub(1));
        self.kv.truncate(keep);
        self.done.truncate(keep);
        keep
    }

    /// One pass over `committed[from..] ⧺ block` at positions `from..` (the cache holding
    /// `committed[..from]`), attending as `attend`; the pass's output `rows` go through the
    /// final norm and the head into `logits` (`rows × vocab`). Afterwards the cache holds
    /// `committed` and none of the block. Returns the vocabulary size.
    pub fn pass(
        &mut self,
        committed: &[TokenId],
        from: usize,
        block: &[TokenId],
        attend: Attend,
        rows: std::ops::Range<usize>,
        logits: &mut Vec<f32>,
    ) -> Result<usize> {
        debug_assert_eq!(self.done.len(), from);
        self.tokens.clear();
        self.tokens.extend_from_slice(&committed[from..]);
        self.tokens.extend_from_slice(block);
        let m = self.tokens.len();
        let r = m - block.len();
        self.positions.clear();
        self.positions
            .extend((from..from + m).map(|p| Pos(p as u32)));
        let mask = match attend {
            Attend::Causal => None,
            Attend::Block | Attend::Full => {
                let full = attend == Attend::Full;
                let bits = (0..m * m)
                    .map(|ij| {
                        let (i, j) = (ij / m, ij % m);
                        full || j <= i || (i >= r && j >= r)
                    })
                    .collect();
                Some(TreeMask::from_bits(m, bits)?)
            }
        };
        let spec = OutputSpec {
            rows: Rows::Last,
            logits: Logits::None,
            taps: vec![self.model.model.config.n_layers - 1],
        };
        let b = Batch {
            tokens: &self.tokens,
            positions: &self.positions,
            mask: mask.as_ref(),
        };
        let out = self
            .model
            .model
            .forward(&mut self.kv, &b, &spec, &mut self.s)?;
        let h = self.model.model.config.hidden_size;
        let v = self.model.score(
            &mut self.head,
            &out.hidden[rows.start * h..rows.end * h],
            &mut self.normed,
            logits,
        );
        self.kv.truncate(committed.len());
        self.done.extend_from_slice(&committed[from..]);
        Ok(v)
    }
}

impl MaskLm {
    /// Final-normed rows of the last decoder layer's outputs `rows` (`n × hidden`) scored by
    /// `head` into `logits` (`n × vocab`); `normed` is scratch. Returns the vocabulary size.
    pub fn score(
        &self,
        head: &mut DraftHead,
        rows: &[f32],
        normed: &mut Vec<f32>,
        logits: &mut Vec<f32>,
    ) -> usize {
        let c = &self.model.config;
        let h = c.hidden_size;
        normed.resize(rows.len(), 0.0);
        for (src, dst) in rows.chunks_exact(h).zip(normed.chunks_exact_mut(h)) {
            ops::rms_norm(src, self.model.output_norm(), c.rms_eps, dst);
        }
        head.logits(&self.model, normed, logits)
    }
}
