//! What the feature-conditioned parallel drafters share (DFlash §3.1, DART §3.1 / docs/dart.md):
//! the fusion of tapped target layers into one hidden-width feature, and the draft head that
//! scores final hidden rows over a draft vocabulary and names their target tokens.

use super::vocab::DraftVocab;
use crate::error::{Error, Result};
use crate::model::source::TensorSource;
use crate::model::{hf_config, Arch, Config, Model};
use crate::runtime::ops;
use crate::runtime::qmatmul::QActs;
use crate::runtime::quant::{prep_acts, sized, Matrix};
use crate::types::TokenId;
use std::sync::Arc;

/// Reads a drafter's decoder-layer config from its `config.json` (`format` names the file in
/// errors): the architecture must be `arch` (`model_type` `model_type`), without attention
/// biases.
pub fn drafter_layers(
    v: &serde_json::Value,
    path: &std::path::Path,
    format: &'static str,
    arch: Arch,
    model_type: &str,
) -> Result<Config> {
    let layers = hf_config(v, path)?;
    if layers.arch != arch {
        return Err(Error::BadModelFile {
            path: path.to_path_buf(),
            format,
            reason: format!("a {format} drafter has model_type \"{model_type}\""),
        });
    }
    if v["attention_bias"].as_bool() == Some(true) {
        return Err(Error::Unsupported(format!(
            "{format} drafters with attention biases"
        )));
    }
    Ok(layers)
}

/// The HF `config.json` keys of a drafter's decoder layers, shared by the published layouts;
/// each method adds its own keys.
pub fn drafter_layers_json(c: &Config, model_type: &str, architecture: &str) -> serde_json::Value {
    serde_json::json!({
        "architectures": [architecture],
        "model_type": model_type,
        "num_hidden_layers": c.n_layers,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": null,
        "max_position_embeddings": c.max_position_embeddings,
        "hidden_act": "silu",
        "attention_bias": false,
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": false,
    })
}

/// Refuses a drafter (`what`) whose layers (`drafter`) cannot share the target's embedding and
/// vocabulary: hidden size and vocabulary size must be the target's. `extra` is the drafter's own
/// further check, run after these.
pub fn check_fits(
    what: &str,
    drafter: &crate::model::Config,
    target: &crate::model::Config,
    extra: impl FnOnce() -> std::result::Result<(), String>,
) -> Result<()> {
    let why = if drafter.hidden_size != target.hidden_size {
        Err(format!(
            "hidden size {} ≠ the target's {} (the drafter uses the target's embedding)",
            drafter.hidden_size, target.hidden_size
        ))
    } else if drafter.vocab_size != target.vocab_size {
        Err(format!(
            "vocabulary {} ≠ the target's {}",
            drafter.vocab_size, target.vocab_size
        ))
    } else {
        extra()
    };
    why.map_err(|m| Error::BadRequest(format!("{what} drafter does not fit the target: {m}")))
}

/// Tap fusion: `g = fc([h_1 ; … ; h_k])` over the concatenated tapped states (no bias), and
/// its RMSNorm. DFlash injects `norm(g)`; DART attends over `norm(g)` and keeps the raw `g`
/// as the residual stream.
pub struct TapFusion {
    pub fc: Matrix,
    norm: Vec<f32>,
    eps: f32,
}

impl TapFusion {
    /// `fc` (`hidden × taps·target_hidden`) and the norm named `norm`.
    pub fn load(
        src: &dyn TensorSource,
        fc: &str,
        norm: &str,
        hidden: usize,
        width: usize,
        eps: f32,
    ) -> Result<Self> {
        Ok(TapFusion {
            fc: src.matrix(fc, hidden, width)?,
            norm: src.vector(norm, hidden)?,
            eps,
        })
    }

    /// Floats of tapped features per position.
    pub fn width(&self) -> usize {
        self.fc.cols
    }

    /// `g = fc(features)` for every row (`rows × width` in, `rows × hidden` out).
    pub fn project(&self, features: &[f32], qa: &mut QActs, out: &mut Vec<f32>) {
        let n = features.len() / self.width().max(1);
        let g = sized(out, n * self.fc.rows);
        prep_acts(qa, &[&self.fc], features, false);
        self.fc.matmul(features, qa, g);
    }

    /// The fusion norm of one row.
    pub fn norm(&self, g: &[f32], out: &mut [f32]) {
        ops::rms_norm(g, &self.norm, self.eps, out);
    }

    /// `norm(fc(features))` for every row (DFlash's context feature).
    pub fn fuse(&self, features: &[f32], qa: &mut QActs, out: &mut Vec<f32>) {
        self.project(features, qa, out);
        ops::rms_norm_inplace(out, &self.norm, self.eps);
    }

    /// `fc` in Q8_0 (int8 activations on the VNNI kernels).
    pub fn quantize(&mut self) {
        self.fc.quantize_q8_0();
    }
}

/// A drafter's LM head over its draft vocabulary: its own matrix (DART), or the target's
/// head rows of the draft vocabulary (DFlash, which shares the target's head).
pub struct DraftHead {
    /// `None`: the target's whole head (the full vocabulary). Shared by every request's copy.
    own: Option<Arc<Matrix>>,
    pub vocab: DraftVocab,
    qa: QActs,
}

impl DraftHead {
    /// The drafter's own head (`vocab.len() × hidden`).
    pub fn own(m: Matrix, vocab: DraftVocab) -> Self {
        DraftHead {
            own: Some(Arc::new(m)),
            vocab,
            qa: QActs::default(),
        }
    }

    /// Another request's head: the same weights (shared), its own scratch.
    pub fn fork(&self) -> Self {
        DraftHead {
            own: self.own.clone(),
            vocab: self.vocab.clone(),
            qa: QActs::default(),
        }
    }

    /// The target's head restricted to `vocab` (no copy for the full vocabulary).
    pub fn of_target(target: &Model, vocab: DraftVocab) -> Self {
        let own = (!vocab.is_full()).then(|| {
            let rows: Vec<usize> = vocab.d2t.iter().map(|&i| i as usize).collect();
            Arc::new(target.output_head().select_rows(&rows))
        });
        DraftHead {
            own,
            vocab,
            qa: QActs::default(),
        }
    }

    /// Logits of every hidden row over the draft vocabulary (`rows × vocab.len()` into `out`);
    /// returns the vocabulary size.
    pub fn logits(&mut self, target: &Model, rows: &[f32], out: &mut Vec<f32>) -> usize {
        let head = self.own.as_deref().unwrap_or(target.output_head());
        let n = rows.len() / head.cols.max(1);
        let o = sized(out, n * head.rows);
        prep_acts(&mut self.qa, &[head], rows, false);
        head.matmul(rows, &self.qa, o);
        head.rows
    }

    /// The target token of a draft id.
    pub fn target_id(&self, draft: usize) -> TokenId {
        self.vocab.target_id(draft)
    }

    /// The head in Q8_0.
    pub fn quantize(&mut self) {
        if let Some(m) = &mut self.own {
            Arc::make_mut(m).quantize_q8_0();
        }
    }
}

/// How a parallel drafter's block — one row of draft-vocabulary logits per slot, all from one
/// pass — becomes a draft: the drafting mode, a setting of the shared selection (every block
/// drafter takes each of them). All are lossless; they differ in acceptance.
pub enum Selection {
    /// A chain of each slot's argmax (one-hot q, the reference codes' choice).
    Greedy,
    /// A chain of samples, each slot drawn from its own distribution with the target's keyed
    /// noise; the distribution is attached as q (at temperature 0: the argmax chain).
    Sample,
    /// A tree searched with DART's continuity-aware pruning (one-hot q). When the request
    /// samples, each depth ranks its tokens by the drafter's log-probability plus the target's
    /// own Gumbel noise at that position (coupled drafting, [`crate::sample::Sampler::coupled`]).
    Tree(crate::speculative::tree_search::TreeDrafting),
    /// A chain chosen by DiffuSpec's causal-consistency path search.
    Cps(CpsDrafting),
}

impl From<crate::speculative::tree_search::TreeDrafting> for Selection {
    fn from(t: crate::speculative::tree_search::TreeDrafting) -> Self {
        Selection::Tree(t)
    }
}

impl Selection {
    /// The same settings for another request (a tree's scratch is its own).
    pub fn fork(&self) -> Selection {
        match self {
            Selection::Greedy => Selection::Greedy,
            Selection::Sample => Selection::Sample,
            Selection::Tree(t) => Selection::Tree(t.fork()),
            Selection::Cps(c) => Selection::Cps(c.clone()),
        }
    }
}

/// A drafter whose draft is chosen by a [`BlockDrafting`]: its mode is set once, at
/// construction, with [`BlockDrafter::with_selection`].
pub trait BlockDrafter: Sized {
    fn drafting_mut(&mut self) -> &mut BlockDrafting;

    /// This drafter with drafts chosen by `selection` (default: [`Selection::Greedy`]).
    fn with_selection(mut self, selection: Selection) -> Self {
        self.drafting_mut().selection = selection;
        self
    }
}

/// One request's [`Selection`] at work, shared by DFlash, DART, PARD and DiffuSpec: the
/// settings, the sampler of sampled chains, and what the last draft measured.
pub struct BlockDrafting {
    sampler: crate::sample::Sampler,
    selection: Selection,
    /// Path probability of each node of the last searched tree (score order).
    conf: Vec<f32>,
    /// Milliseconds the last [`BlockDrafting::draft`] took (the search, CPS or argmax).
    last_ms: f64,
}

/// DiffuSpec's draft selection (`speculative::cps`) over a block: the pruned lattice, the
/// beam search with an optional n-gram proxy, the stop tokens.
#[derive(Clone)]
pub struct CpsDrafting {
    pub lattice: crate::speculative::cps::LatticeParams,
    pub cps: crate::speculative::cps::Cps,
    pub ngram: Option<Arc<crate::ngram::arpa::ArpaLm>>,
    pub stop: Vec<TokenId>,
}

impl BlockDrafting {
    /// `selection` for a request sampled with `sampling` (sampled chains draw with the target's
    /// seed, so they use the noise the target samples with).
    pub fn new(sampling: crate::sample::SamplingParams, selection: Selection) -> Result<Self> {
        Ok(BlockDrafting {
            sampler: crate::sample::Sampler::new(sampling)?,
            selection,
            conf: vec![],
            last_ms: 0.0,
        })
    }

    /// The same settings for another request sampled with `sampling`.
    pub fn fork(&self, sampling: crate::sample::SamplingParams) -> Result<Self> {
        Self::new(sampling, self.selection.fork())
    }

    pub fn selection(&self) -> &Selection {
        &self.selection
    }

    /// Whether the request samples (T > 0).
    pub fn samples(&self) -> bool {
        !self.sampler.params.is_greedy()
    }

    /// Whether drafts are searched trees.
    pub fn is_tree(&self) -> bool {
        matches!(self.selection, Selection::Tree(_))
    }

    /// Milliseconds the last [`BlockDrafting::draft`] took.
    pub fn last_ms(&self) -> f64 {
        self.last_ms
    }

    /// `logits`: `slots × v` rows, slot i predicting absolute position `first + i`, over the
    /// draft vocabulary of `head`. `committed` ends with the root.
    pub fn draft(
        &mut self,
        logits: &[f32],
        v: usize,
        head: &DraftHead,
        committed: &[TokenId],
        first: usize,
        max_nodes: usize,
    ) -> Result<crate::speculative::DraftTree> {
        let t = std::time::Instant::now();
        let r = self.select(logits, v, head, committed, first, max_nodes);
        self.last_ms = t.elapsed().as_secs_f64() * 1e3;
        r
    }

    fn select(
        &mut self,
        logits: &[f32],
        v: usize,
        head: &DraftHead,
        committed: &[TokenId],
        first: usize,
        max_nodes: usize,
    ) -> Result<crate::speculative::DraftTree> {
        self.conf.clear();
        let mut tree = crate::speculative::DraftTree::new();
        let mut parent = None;
        let sampler = &self.sampler;
        let sample = match &mut self.selection {
            Selection::Tree(td) => {
                let coupled = Some((sampler, first));
                let to_target = |i| head.target_id(i);
                let searched = td.draft(logits, v, to_target, committed, max_nodes, coupled)?;
                self.conf = searched.path_prob;
                return Ok(searched.tree);
            }
            Selection::Cps(c) => {
                let lat = crate::speculative::cps::Lattice::from_logits(
                    logits,
                    v,
                    |i| head.target_id(i),
                    |t| head.vocab.draft_id(t).map(|d| d as usize),
                    &c.stop,
                    &c.lattice,
                );
                let path = c.cps.search(&lat, committed, c.ngram.as_deref(), &c.stop);
                for &t in path.iter().take(max_nodes) {
                    parent = Some(tree.push(parent, t, None)?);
                }
                return Ok(tree);
            }
            Selection::Sample => self.samples(),
            Selection::Greedy => false,
        };
        let slots = (logits.len() / v.max(1)).min(max_nodes);
        for i in 0..slots {
            let row = &logits[i * v..(i + 1) * v];
            let (tok, q) = if sample {
                let mut q = self.sampler.dist(row);
                for e in q.entries.iter_mut() {
                    e.0 = head.target_id(e.0.idx());
                }
                (self.sampler.pick_at(&q, first + i), Some(q))
            } else {
                (head.target_id(ops::argmax(row).idx()), None)
            };
            parent = Some(tree.push(parent, tok, q)?);
        }
        Ok(tree)
    }

    /// [`crate::speculative::Drafter::node_confidence`] for the last draft.
    pub fn node_confidence(&self) -> Option<&[f32]> {
        self.is_tree().then_some(&self.conf[..])
    }
}
