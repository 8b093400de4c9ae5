//! PARD drafter training (PARD §3.2, docs/pard.md): mask-token subtasks with conditional
//! drop-token (COD), one cross-entropy mean over every kept label, on target-independent data
//! (token sequences; no target features). The shared loop (`train::run`) optimises it.
//!
//! The paper's layout packs K copies of a sequence (copy 0 the real tokens, copies 1..K−1 all
//! masks, positions restarting per copy) under an attention pattern where copy c at position p
//! sees the real tokens 0..=p−c and its chain of masks (copy c−1, p−1), …, (copy 1, p−c+1).
//! Every kept mask is therefore the j-th mask after an anchor a = p − c, and COD keeps whole
//! chain prefixes (a kept mask keeps all earlier masks of its chain). This module builds the
//! same computation in anchor form — the real tokens once, then each kept chain as a block of
//! masks at positions a+1..a+L — which holds exactly the copies' kept slots, with the same
//! visibility, positions and labels ([`cod_chains`], [`build`]; a test checks it against the
//! copies' definition).
//!
//! Deviations: labels outside the draft vocabulary are skipped (the drafter scores with the
//! target's head rows of that vocabulary); end-of-turn tokens are trained (the reference
//! code's collator never trains them); the mask token's embedding is the target's row, frozen.

pub mod net;
pub mod pipeline;
pub mod teacher;

use crate::drafters::vocab::DraftVocab;
use crate::error::{Error, Result};
use crate::model::{Arch, Config, Model};
use crate::train::data::Sample;
use crate::train::dflash::net::FrozenHead;
use crate::train::fused::Ranges;
use crate::train::run::{self, cerr, BatchLoss, Eval, LogLine, Schedule};
use crate::types::TokenId;
use candle_core::{DType, Device, Tensor, D};
use net::{Batch, CResult, Net};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// COD's settings (paper: K 8, r 0.7, r_min 0.2; r = 1 keeps every copy whole); also
/// `paradraft train pard`'s flags.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, clap::Args)]
pub struct Cod {
    /// K: copies in training (the real tokens and K − 1 mask copies; the paper's 8).
    #[arg(long, default_value_t = 8)]
    pub k: usize,
    /// COD retention r (copy i keeps max(r^i, r_min) of the positions; 1 keeps all).
    #[arg(long = "cod-r", default_value_t = 0.7)]
    pub r: f64,
    #[arg(long = "cod-r-min", default_value_t = 0.2)]
    pub r_min: f64,
}

impl Default for Cod {
    fn default() -> Self {
        Cod {
            k: 8,
            r: 0.7,
            r_min: 0.2,
        }
    }
}

impl Cod {
    /// Positions kept in mask copy i (1-based) of an S-token sequence: ⌊S · max(r^i, r_min)⌋.
    pub fn kept(&self, s: usize, i: usize) -> usize {
        (s as f64 * self.r.powi(i as i32).max(self.r_min)).floor() as usize
    }
}

/// How a mask-token drafter's training slots are laid out for one sequence, and how it is
/// written out: PARD's COD ([`Cod`]) or DiffuSpec's masked diffusion (`train::dlm`). Both
/// share the real-token stream of [`Layout::real`], this module's network, loss and loop.
pub trait Objective: Sync {
    /// Refuses settings the objective cannot train with.
    fn check(&self) -> Result<()>;
    /// One sequence's slots, drawn with `rng`.
    fn layout(
        &self,
        tokens: &[TokenId],
        mask: TokenId,
        vocab: &DraftVocab,
        rng: &mut ChaCha8Rng,
    ) -> Layout;
    /// The slots of one drafting pass of `k` after each anchor (the anchor's real slot and
    /// what follows it), and for each anchor the `k` slots whose outputs predict
    /// x_{a+1..=a+k} in order.
    fn eval_layout(
        &self,
        tokens: &[TokenId],
        anchors: &[usize],
        k: usize,
        mask: TokenId,
        vocab: &DraftVocab,
    ) -> (Layout, Vec<u32>);
    /// The method's own `config.json` keys of an exported drafter.
    fn stamp(&self, config: &mut serde_json::Value, mask: TokenId);
}

impl Objective for Cod {
    fn check(&self) -> Result<()> {
        if self.k < 2
            || self.k > 64
            || !(self.r > 0.0 && self.r <= 1.0)
            || !(0.0..=1.0).contains(&self.r_min)
        {
            return Err(Error::BadRequest(format!(
                "COD needs 2 ≤ K ≤ 64, 0 < r ≤ 1 and 0 ≤ r_min ≤ 1 (got K {}, r {}, r_min {})",
                self.k, self.r, self.r_min
            )));
        }
        Ok(())
    }

    fn layout(
        &self,
        tokens: &[TokenId],
        mask: TokenId,
        vocab: &DraftVocab,
        rng: &mut ChaCha8Rng,
    ) -> Layout {
        layout(tokens, &cod_chains(tokens.len(), self, rng), mask, vocab)
    }

    fn eval_layout(
        &self,
        tokens: &[TokenId],
        anchors: &[usize],
        k: usize,
        mask: TokenId,
        vocab: &DraftVocab,
    ) -> (Layout, Vec<u32>) {
        let chains: Vec<(i64, usize)> = anchors.iter().map(|&a| (a as i64, k - 1)).collect();
        let s = tokens.len();
        let rows = anchors
            .iter()
            .enumerate()
            .flat_map(|(c, &a)| {
                let b0 = s + c * (k - 1);
                std::iter::once(a as u32).chain((0..k - 1).map(move |j| (b0 + j) as u32))
            })
            .collect();
        (layout(tokens, &chains, mask, vocab), rows)
    }

    fn stamp(&self, v: &mut serde_json::Value, mask: TokenId) {
        v["pard_token"] = mask.0.into();
        v["spd_type"] = "pard".into();
        v["pard_k"] = self.k.into();
    }
}

/// The mask-token trainers' default schedule (batches of 4 sequences, one epoch, lr 3e-4,
/// 2 % warm-up, clipping at 1, a checkpoint every 25 steps).
pub fn default_schedule() -> Schedule {
    Schedule {
        batch_seqs: 4,
        epochs: 1,
        max_steps: 0,
        lr: 3e-4,
        warmup_ratio: 0.02,
        grad_clip: 1.0,
        seed: 0,
        save_every: 25,
        pause_at: 0,
    }
}

/// What training needs: the target (its embedding rows are the inputs, its head rows the
/// output layer), the token sequences and the split, the draft vocabulary and the mask token.
pub struct Data<'a> {
    pub target: &'a Model,
    pub samples: &'a [Sample],
    pub train: Vec<usize>,
    pub vocab: &'a DraftVocab,
    pub mask: TokenId,
    pub device: Device,
    /// Longest sequence trained or evaluated on (longer samples are truncated).
    pub max_seq: usize,
}

/// COD's keep sets in anchor form for an S-token sequence: `(a, L)` for every kept chain —
/// anchor a (the last real position it sees, −1 ..= S − 2) and L kept masks at positions
/// a+1..=a+L — sorted by anchor ([`cod_lengths`] drawn, as [`chains_of`] lists them).
pub fn cod_chains(s: usize, cod: &Cod, rng: &mut ChaCha8Rng) -> Vec<(i64, usize)> {
    chains_of(&cod_lengths(s, cod, rng))
}

/// COD's kept chain length at every anchor a (index a + 1; 0: no chain) of an S-token
/// sequence. Copy i keeps ⌊S·max(r^i, r_min)⌋ positions drawn uniformly from the successors
/// `(q + 1) mod S` of copy i−1's kept positions (copy 0 keeps all); a copy that would keep none
/// ends the copies. Wrapped successors (a < −1) only carry ignored labels and are dropped.
pub fn cod_lengths(s: usize, cod: &Cod, rng: &mut ChaCha8Rng) -> Vec<usize> {
    let mut kept: Vec<usize> = (0..s).collect();
    let mut len = vec![0usize; s + 1]; // by anchor + 1
    for i in 1..cod.k {
        let n = cod.kept(s, i);
        if n == 0 || s == 0 {
            break;
        }
        let succ: Vec<usize> = kept.iter().map(|&q| (q + 1) % s).collect();
        let pick = run::sample_sorted(0..succ.len(), n, rng);
        kept = pick.into_iter().map(|j| succ[j]).collect();
        kept.sort_unstable();
        for &p in &kept {
            let a = p as i64 - i as i64;
            if a >= -1 {
                len[(a + 1) as usize] = i;
            }
        }
    }
    len
}

/// The chains `(a, L)` of chain lengths by anchor + 1 ([`cod_lengths`]), sorted by anchor.
pub fn chains_of(len: &[usize]) -> Vec<(i64, usize)> {
    len.iter()
        .enumerate()
        .filter(|(_, &l)| l > 0)
        .map(|(a1, &l)| (a1 as i64 - 1, l))
        .collect()
}

/// A sequence's layout with its labels.
pub struct Labeled {
    pub batch: Batch,
    /// Draft id each `out` row must predict, and its subtask (1: the next token).
    pub labels: Vec<u32>,
    pub depth: Vec<u8>,
}

/// One sequence's slots in anchor form.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    pub tokens: Vec<TokenId>,
    pub positions: Vec<u32>,
    pub ranges: Vec<Ranges>,
    /// Scored slots: (slot, draft-vocabulary label, subtask).
    pub out: Vec<(u32, u32, u8)>,
}

impl Layout {
    /// The real tokens once: slot i at position i sees 0..=i and predicts x_{i+1} (subtask 1)
    /// when that is in the draft vocabulary.
    pub fn real(tokens: &[TokenId], vocab: &DraftVocab) -> Layout {
        let mut l = Layout::default();
        for (i, &t) in tokens.iter().enumerate() {
            l.tokens.push(t);
            l.positions.push(i as u32);
            l.ranges.push([(0, i as u32 + 1), (0, 0)]);
            l.label(tokens, vocab, i, i + 1, 1);
        }
        l
    }

    /// Scores `slot` with x_`target` (subtask `depth`) when that is inside the sequence and the
    /// draft vocabulary.
    pub fn label(
        &mut self,
        tokens: &[TokenId],
        vocab: &DraftVocab,
        slot: usize,
        target: usize,
        depth: u8,
    ) {
        if let Some(id) = tokens.get(target).and_then(|&t| vocab.draft_id(t)) {
            self.out.push((slot as u32, id, depth));
        }
    }
}

/// The slots of `tokens` in anchor form: the real stream ([`Layout::real`]); then for each
/// chain (a, L) masks j = 1..=L (position a + j, see the real tokens 0..=a and the chain's
/// masks 1..=j, predict x_{a+j+1}). Only labels inside the sequence and the draft vocabulary
/// are scored.
pub fn layout(
    tokens: &[TokenId],
    chains: &[(i64, usize)],
    mask: TokenId,
    vocab: &DraftVocab,
) -> Layout {
    let mut l = Layout::real(tokens, vocab);
    for &(a, len) in chains {
        let b0 = l.tokens.len() as u32;
        let real = (a + 1) as u32;
        for j in 1..=len {
            let slot = l.tokens.len();
            l.tokens.push(mask);
            l.positions.push((a + j as i64) as u32);
            l.ranges.push([(0, real), (b0, b0 + j as u32)]);
            l.label(tokens, vocab, slot, (a + 1) as usize + j, j as u8 + 1);
        }
    }
    l
}

/// [`layout`] of sample `si` (truncated to `data.max_seq`) embedded ([`embed`]).
pub fn build(data: &Data, si: usize, chains: &[(i64, usize)]) -> CResult<Option<Labeled>> {
    let tokens = truncated(data, si);
    if tokens.len() < 2 {
        return Ok(None);
    }
    embed(data.target, layout(tokens, chains, data.mask, data.vocab))
}

fn truncated<'a>(data: &'a Data, si: usize) -> &'a [TokenId] {
    let s = &data.samples[si];
    &s.tokens[..s.tokens.len().min(data.max_seq)]
}

/// A layout's slots embedded by the target's (frozen) embedding rows, with its labels; `None`
/// when nothing is scored.
pub fn embed(target: &Model, l: Layout) -> CResult<Option<Labeled>> {
    let Layout {
        tokens: toks,
        positions,
        ranges,
        out,
    } = l;
    if out.is_empty() {
        return Ok(None);
    }
    let h = target.config.hidden_size;
    let mut x = vec![0f32; toks.len() * h];
    for (t, row) in toks.iter().zip(x.chunks_exact_mut(h)) {
        target.embed_row(t.idx(), row);
    }
    Ok(Some(Labeled {
        batch: Batch {
            x: Tensor::from_vec(x, (toks.len(), h), &Device::Cpu)?,
            positions,
            ranges,
            out: out.iter().map(|o| o.0).collect(),
        },
        labels: out.iter().map(|o| o.1).collect(),
        depth: out.iter().map(|o| o.2).collect(),
    }))
}

/// Σ cross-entropy over a sequence's scored rows, their count, and subtask-1 hits / count.
fn sequence_loss(
    net: &Net,
    head: &FrozenHead,
    lb: &Labeled,
) -> CResult<(Tensor, usize, usize, usize)> {
    let logits = head.forward(&net.forward(&lb.batch)?)?;
    let nll = crate::train::fused::cross_entropy_kl(&logits, &lb.labels, None, 0.0)?;
    let am: Vec<u32> = logits.argmax(D::Minus1)?.to_vec1()?;
    let (mut hit, mut n1) = (0, 0);
    for (r, &d) in lb.depth.iter().enumerate() {
        if d == 1 {
            n1 += 1;
            hit += (am[r] == lb.labels[r]) as usize;
        }
    }
    Ok((nll.sum_all()?, lb.labels.len(), hit, n1))
}

/// One mean over every scored label of the sequences `chunk` (PARD's reference loss: subtask
/// k weighs by its retention; DiffuSpec's eq. 3: the corrupted slots), and the subtask-1
/// accuracy.
fn batch_loss(
    net: &Net,
    head: &FrozenHead,
    data: &Data,
    obj: &dyn Objective,
    seed: u64,
    epoch: usize,
    chunk: &[usize],
) -> Result<BatchLoss> {
    let (mut total, mut count, mut hit, mut n1) = (None::<Tensor>, 0usize, 0usize, 0usize);
    for &si in chunk {
        let mut rng = ChaCha8Rng::seed_from_u64(
            seed ^ ((epoch as u64) << 32) ^ (si as u64).wrapping_mul(0x9e37_79b1),
        );
        let tokens = truncated(data, si);
        if tokens.len() < 2 {
            continue;
        }
        let l = obj.layout(tokens, data.mask, data.vocab, &mut rng);
        let Some(lb) = embed(data.target, l).map_err(cerr)? else {
            continue;
        };
        let (l, c, h1, c1) = sequence_loss(net, head, &lb).map_err(cerr)?;
        total = Some(match total {
            None => l,
            Some(t) => (t + l).map_err(cerr)?,
        });
        count += c;
        hit += h1;
        n1 += c1;
    }
    Ok(match total {
        Some(t) if count > 0 => Some((
            (t / count as f64).map_err(cerr)?,
            hit as f64 / n1.max(1) as f64,
        )),
        _ => None,
    })
}

/// The drafter's shape for `target`: its first `layers` decoder layers in the HF layout.
pub fn config_for(target: &Model, layers: usize) -> Result<Config> {
    let tc = &target.config;
    if layers == 0 || layers > tc.n_layers {
        return Err(Error::BadRequest(format!(
            "--draft-layers {layers}: between 1 and the target's {} layers",
            tc.n_layers
        )));
    }
    if tc.arch == Arch::Qwen2 {
        return Err(Error::Unsupported(
            "PARD training for targets with attention biases (Qwen2)".into(),
        ));
    }
    if tc.rope_scaling != crate::model::config::RopeScaling::None {
        return Err(Error::Unsupported(
            "PARD training for targets with RoPE scaling".into(),
        ));
    }
    if tc.extras != crate::model::config::Extras::default() {
        return Err(Error::Unsupported(format!(
            "PARD training for {} targets (its training graph has Llama / Qwen layers only)",
            tc.arch.name()
        )));
    }
    let mut c = tc.clone();
    c.n_layers = layers;
    c.rope_style = crate::runtime::ops::RopeStyle::Half;
    c.tie_embeddings = true;
    Ok(c)
}

/// Trains (or resumes) in `dir` with `obj`, starting from `init` (a drafter to adapt further)
/// or else the target's first layers; `on_log` sees every step. Returns the trained net.
pub fn train(
    config: &Config,
    data: &Data,
    obj: &dyn Objective,
    schedule: &Schedule,
    init: Option<Net>,
    dir: &Path,
    on_log: impl FnMut(&LogLine),
) -> Result<Net> {
    check(config, data)?;
    obj.check()?;
    let ckpt = dir.join("checkpoint");
    let (net, mut opt, step, elapsed) = run::start(
        &ckpt,
        |n: &Net| &n.vars,
        |t| Net::from_tensors(config.clone(), t)?.to_device(&data.device),
        || match init {
            Some(n) if n.config.n_layers != config.n_layers => Err(Error::BadRequest(format!(
                "the initial drafter has {} layers, the run {}",
                n.config.n_layers, config.n_layers
            ))),
            Some(n) => n.to_device(&data.device).map_err(cerr),
            None => Net::from_target(config.clone(), data.target)
                .and_then(|n| n.to_device(&data.device))
                .map_err(cerr),
        },
    )?;
    let head = crate::train::dflash::frozen_head(data.target, data.vocab)
        .and_then(|h| h.to_device(&data.device))
        .map_err(cerr)?;
    run::train_loop(
        &net.vars,
        &mut opt,
        step,
        elapsed,
        &data.train,
        schedule,
        dir,
        |chunk, epoch| batch_loss(&net, &head, data, obj, schedule.seed, epoch, chunk),
        on_log,
    )?;
    Ok(net)
}

fn check(config: &Config, data: &Data) -> Result<()> {
    let tc = &data.target.config;
    if config.hidden_size != tc.hidden_size || config.vocab_size != tc.vocab_size {
        return Err(Error::BadRequest(
            "mask-token drafter training: the drafter must share the target's hidden size and vocabulary".into(),
        ));
    }
    if data.mask.idx() >= tc.vocab_size {
        return Err(Error::BadRequest(format!(
            "mask token {} is outside the vocabulary ({})",
            data.mask.0, tc.vocab_size
        )));
    }
    Ok(())
}

/// Held-out chain acceptance at K = `k`: at up to `anchors` evenly spaced response positions
/// per sample (with K tokens after them), the greedy drafts of one pass (`obj`'s drafting
/// layout: PARD's anchor slot and K − 1 masks, DiffuSpec's anchor and block) against the
/// sequence's tokens.
pub fn evaluate(
    net: &Net,
    head: &FrozenHead,
    data: &Data,
    obj: &dyn Objective,
    held_out: &[usize],
    k: usize,
    anchors: usize,
) -> Result<Eval> {
    let (mut hits, mut blocks) = (vec![0usize; k], 0);
    for &si in held_out {
        let s = &data.samples[si];
        let len = s.tokens.len().min(data.max_seq);
        let resp = (s.prompt_len as usize).max(1);
        let full: Vec<usize> = (resp - 1..len).filter(|&a| a + k < len).collect();
        if full.is_empty() {
            continue;
        }
        let step = full.len().div_ceil(anchors.max(1)).max(1);
        let chosen: Vec<usize> = full.iter().copied().step_by(step).collect();
        let (l, rows) = obj.eval_layout(&s.tokens[..len], &chosen, k, data.mask, data.vocab);
        let Some(mut lb) = embed(data.target, l).map_err(cerr)? else {
            continue;
        };
        // Score exactly the drafting rows.
        lb.batch.out = rows;
        let am: Vec<u32> = net
            .forward(&lb.batch)
            .and_then(|x| head.forward(&x))
            .and_then(|l| l.argmax(D::Minus1))
            .and_then(|a| a.to_vec1())
            .map_err(cerr)?;
        for (c, &a) in chosen.iter().enumerate() {
            blocks += 1;
            for j in 0..k {
                if data.vocab.d2t[am[c * k + j] as usize] != s.tokens[a + 1 + j].0 {
                    break;
                }
                hits[j] += 1;
            }
        }
    }
    Ok(Eval::from_hits(k, blocks, &hits))
}

/// The drafter's `config.json`: the HF causal-LM keys, the objective's own keys (PARD:
/// `pard_token`, `spd_type`, `pard_k`) and the draft vocabulary's size.
pub fn config_json(
    c: &Config,
    mask: TokenId,
    obj: &dyn Objective,
    vocab: &DraftVocab,
) -> serde_json::Value {
    let (mt, arch) = match c.arch {
        Arch::Qwen3 => ("qwen3", "Qwen3ForCausalLM"),
        Arch::Qwen2 => ("qwen2", "Qwen2ForCausalLM"),
        Arch::Llama => ("llama", "LlamaForCausalLM"),
        // Gemma targets are refused by `config_for` (their layers are not Llama's); Phi-3's
        // are Llama's, written unfused (its loader takes either form).
        Arch::Gemma => ("gemma", "GemmaForCausalLM"),
        Arch::Gemma2 => ("gemma2", "Gemma2ForCausalLM"),
        Arch::Gemma3 => ("gemma3_text", "Gemma3ForCausalLM"),
        Arch::Phi3 => ("phi3", "Phi3ForCausalLM"),
        Arch::Qwen3Moe => ("qwen3_moe", "Qwen3MoeForCausalLM"),
    };
    let mut v = crate::drafters::parts::drafter_layers_json(c, mt, arch);
    v["tie_word_embeddings"] = true.into();
    obj.stamp(&mut v, mask);
    if !vocab.is_full() {
        v["draft_vocab_size"] = vocab.len().into();
    }
    v
}

/// Writes the drafter in the compact layout (its layers and final norm in `dtype`, the draft
/// vocabulary's maps; the embedding and tied head come from the target at load time).
pub fn export(
    net: &Net,
    mask: TokenId,
    obj: &dyn Objective,
    vocab: &DraftVocab,
    dir: &Path,
    dtype: DType,
) -> Result<()> {
    let js = config_json(&net.config, mask, obj, vocab);
    let v = (!vocab.is_full()).then_some(vocab);
    crate::train::export::write_drafter(&net.vars, v, &js, dir, dtype)
}

/// An exported drafter (compact layout) as a trainable network with its mask token and
/// vocabulary, for evaluation or fine-tuning.
pub fn load_exported(dir: &Path, target: &Model) -> Result<(Net, TokenId, DraftVocab)> {
    use crate::model::source::SafetensorsSource;
    let (v, cp) = crate::model::read_config_json(dir, "mask-token drafter config.json")?;
    let mut config = crate::model::hf_config(&v, &cp)?;
    config.tie_embeddings = true;
    let mask = crate::drafters::mask_lm::mask_token_id(&v)
        .map_err(Error::BadRequest)?
        .ok_or_else(|| Error::BadRequest(format!("{}: no mask token id", cp.display())))?;
    let src = SafetensorsSource::open(dir)?;
    let size = v["draft_vocab_size"].as_u64().map(|n| n as usize);
    let vocab = DraftVocab::load(&src, size, target.config.vocab_size, "mask-token drafter")?;
    let mut t = std::collections::HashMap::new();
    for (name, shape) in Net::shapes(&config) {
        let x = src.f32_by_hf_name(&name, &shape)?;
        t.insert(
            name,
            Tensor::from_vec(x, shape, &Device::Cpu).map_err(cerr)?,
        );
    }
    let net = Net::from_tensors(config, &t).map_err(cerr)?;
    Ok((net, TokenId(mask), vocab))
}

#[cfg(test)]
mod tests;
