//! DART drafter training (DART §3.4 and Appendix B, docs/dart.md): self-distilled sequences with
//! cached target taps, the prefix-shared layout (every clean slot of a sequence, then blocks
//! of `d − 1` mask slots for sampled prefixes) with its three-part attention mask, and a
//! distillation loss weighted `λ_t = γ^(t−1)` over the t-th future token; the shared loop
//! (`train::run`) optimises it. Deviations for the CPU budget: prefixes are sampled (the paper
//! uses every prefix; depth 1 is scaled by the sampling rate so the objective's expectation is
//! the paper's), and the loss is the target token's cross-entropy plus `kl_weight` × the KL
//! from the target's distribution over the draft vocabulary (the paper: KL alone).

pub mod net;
pub mod pipeline;

use crate::drafters::dart::{dart_taps, DartConfig};
use crate::drafters::vocab::DraftVocab;
use crate::error::{Error, Result};
use crate::model::source::TensorSource;
use crate::model::Model;
use crate::train::data::Sample;
use crate::train::dflash::net::FrozenHead;
use crate::train::fused::Ranges;
use crate::train::run::{self, cerr, BatchLoss, Eval, LogLine, Schedule};
use candle_core::{DType, Device, Tensor, D};
use net::{Batch, CResult, Net};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// Hyper-parameters (the paper's where the CPU allows; see the module notes).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DartParams {
    /// Prefixes per sequence that get a block of mask slots (resampled every epoch; 0: all).
    pub anchors: usize,
    /// Depth decay γ: the t-th future token weighs γ^(t−1) (paper: 0.6).
    pub gamma: f32,
    /// Weight of the KL term (0: cross-entropy of the target's token only).
    pub kl_weight: f64,
    #[serde(flatten)]
    pub schedule: Schedule,
}

impl Default for DartParams {
    fn default() -> Self {
        DartParams {
            anchors: 48,
            gamma: 0.6,
            kl_weight: 1.0,
            schedule: Schedule {
                batch_seqs: 4,
                epochs: 2,
                max_steps: 0,
                lr: 6e-4,
                warmup_ratio: 0.04,
                grad_clip: 0.5,
                seed: 0,
                save_every: 50,
                pause_at: 0,
            },
        }
    }
}

pub use crate::train::run::Data;

/// A sequence's batch with its labels.
pub struct Labeled {
    pub batch: Batch,
    /// Draft id each `out` row must predict, its loss weight, and its depth (1 = clean slot).
    pub labels: Vec<u32>,
    pub weights: Vec<f32>,
    pub depth: Vec<u8>,
    /// `[out, hidden]`: the target's last-layer output before each label.
    pub target_hidden: Option<Tensor>,
    /// Teacher-forced text: `labels` are placeholders, replaced by the target's argmax over the
    /// draft vocabulary (from `target_hidden`) when the loss is formed.
    pub teacher: bool,
    /// Teacher-forced text only: per scored row, the positions `lo..hi` between its block's
    /// prefix and its label. A mask row's label is the target's greedy continuation only where
    /// each of those tokens is the target's own argmax; elsewhere the text went another way
    /// than a greedy draft can, and the row is not trained on.
    pub chain: Vec<(u32, u32)>,
    /// Teacher-forced text only: per position, the scored clean row that predicts it
    /// (`u32::MAX`: none) and its token's draft id (`u32::MAX`: outside the draft vocabulary).
    pub clean_row: Vec<u32>,
    pub draft_tok: Vec<u32>,
}

impl Labeled {
    /// The rows' weights with the mask rows of teacher-forced text whose chain left the target's
    /// argmax (`labels`: the target's argmax per row) set to 0.
    pub fn chain_weights(&self, labels: &[u32]) -> Vec<f32> {
        let mut w = self.weights.clone();
        if !self.teacher {
            return w;
        }
        let greedy = |q: usize| {
            let r = self.clean_row[q];
            r != u32::MAX
                && self.draft_tok[q] != u32::MAX
                && labels[r as usize] == self.draft_tok[q]
        };
        for (wi, &(lo, hi)) in w.iter_mut().zip(&self.chain) {
            if !(lo as usize..hi as usize).all(greedy) {
                *wi = 0.0;
            }
        }
        w
    }
}

/// Prefixes `g` whose depth-1 token `x_{g+2}` is a response token.
pub fn valid_prefixes(s: &Sample) -> std::ops::Range<usize> {
    let t = s.tokens.len();
    (s.prompt_len as usize).saturating_sub(2)..t.saturating_sub(2)
}

/// The prefix-shared layout of sample `si` with mask blocks for `anchors` (sorted prefixes):
/// positions, the three-part mask, and the scored rows with labels and weights.
pub fn build(
    data: &Data,
    si: usize,
    anchors: &[usize],
    masks: usize,
    gamma: f32,
) -> CResult<Option<Labeled>> {
    let s = &data.samples[si];
    let (t, resp) = (s.tokens.len(), s.prompt_len as usize);
    if t < 3 {
        return Ok(None);
    }
    let clean = t - 1;
    let h = data.target.config.hidden_size;
    let f = data.features;
    let taps = f
        .sample(data.target, si, s)
        .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    let mut features = Vec::with_capacity(clean * f.ctx());
    taps.rows_into(clean, &mut features);
    let mut next_emb = vec![0f32; clean * h];
    for i in 0..clean {
        data.target
            .embed_row(s.tokens[i + 1].idx(), &mut next_emb[i * h..(i + 1) * h]);
    }
    let teacher = si >= data.teacher_from;
    let n_valid = valid_prefixes(s).len().max(1);
    let clean_w = (anchors.len() as f32 / n_valid as f32).min(1.0);
    let (mut positions, mut ranges): (Vec<u32>, Vec<Ranges>) = (vec![], vec![]);
    let (mut out, mut labels, mut weights, mut depth, mut rows) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut chain, mut clean_row) = (vec![], vec![u32::MAX; if teacher { t } else { 0 }]);
    let mut label = |slot: usize, p: usize, w: f32, d: u8| {
        if p < t && p >= resp {
            if teacher {
                // Depth d's label follows the d - 1 tokens after the block's prefix.
                chain.push(((p + 1 - d as usize) as u32, p as u32));
                if d == 1 {
                    clean_row[p] = out.len() as u32;
                }
            }
            let id = if teacher {
                Some(0)
            } else {
                data.vocab.draft_id(s.tokens[p])
            };
            if let Some(id) = id {
                out.push(slot as u32);
                labels.push(id);
                weights.push(w);
                depth.push(d);
                rows.push(p - 1);
            }
        }
    };
    for i in 0..clean {
        positions.push(i as u32);
        ranges.push([(0, i as u32 + 1), (0, 0)]);
        label(i, i + 2, clean_w, 1);
    }
    for (a, &g) in anchors.iter().enumerate() {
        let b0 = (clean + a * masks) as u32;
        for j in 1..=masks {
            positions.push((g + j) as u32);
            ranges.push([(0, g as u32 + 1), (b0, b0 + j as u32)]);
            label(
                clean + a * masks + j - 1,
                g + 2 + j,
                gamma.powi(j as i32),
                j as u8 + 1,
            );
        }
    }
    if out.is_empty() {
        return Ok(None);
    }
    let draft_tok = match teacher {
        true => (s.tokens.iter())
            .map(|&x| data.vocab.draft_id(x).unwrap_or(u32::MAX))
            .collect(),
        false => vec![],
    };
    let dev = &Device::Cpu;
    let target_hidden = (f.width() - f.ctx() == h)
        .then(|| {
            let mut th = Vec::with_capacity(rows.len() * h);
            taps.tail_rows_into(&rows, &mut th);
            Tensor::from_vec(th, (rows.len(), h), dev)
        })
        .transpose()?;
    Ok(Some(Labeled {
        batch: Batch {
            features: Tensor::from_vec(features, (clean, f.ctx()), dev)?,
            next_emb: Tensor::from_vec(next_emb, (clean, h), dev)?,
            masks: anchors.len() * masks,
            positions,
            ranges,
            out,
        },
        labels,
        weights,
        depth,
        target_hidden,
        teacher,
        chain,
        clean_row,
        draft_tok,
    }))
}

/// Up to `n` distinct valid prefixes (all when `n` is 0), uniformly without replacement, sorted.
pub fn sample_prefixes(s: &Sample, n: usize, rng: &mut ChaCha8Rng) -> Vec<usize> {
    run::sample_sorted(valid_prefixes(s), n, rng)
}

/// The weighted loss of the sequences `chunk` and the depth-1 accuracy.
fn batch_loss(
    net: &Net,
    head: &FrozenHead,
    data: &Data,
    p: &DartParams,
    epoch: usize,
    chunk: &[usize],
) -> Result<BatchLoss> {
    let items: Vec<(usize, Vec<usize>)> = chunk
        .iter()
        .map(|&si| {
            let mut rng = ChaCha8Rng::seed_from_u64(
                p.schedule.seed ^ ((epoch as u64) << 32) ^ (si as u64).wrapping_mul(0x9e37_79b1),
            );
            (si, sample_prefixes(&data.samples[si], p.anchors, &mut rng))
        })
        .collect();
    Ok(sequences_loss(net, head, data, &items, p.gamma, p.kl_weight)?.map(|(l, acc, _)| (l, acc)))
}

/// The weighted mean loss of sequences `items` (sample index, its sorted prefixes), the
/// depth-1 accuracy and the rows scored; `None` when nothing is labelled.
pub fn sequences_loss(
    net: &Net,
    head: &FrozenHead,
    data: &Data,
    items: &[(usize, Vec<usize>)],
    gamma: f32,
    kl: f64,
) -> Result<Option<(Tensor, f64, usize)>> {
    let masks = net.config.draft_length;
    let (mut total, mut wsum, mut hit, mut n1, mut rows) = (None::<Tensor>, 0f32, 0, 0, 0);
    for (si, anchors) in items {
        let Some(lb) = build(data, *si, anchors, masks, gamma).map_err(cerr)? else {
            continue;
        };
        rows += lb.labels.len();
        let (l, w, h1, c1) = sequence_loss(net, head, &lb, kl).map_err(cerr)?;
        total = Some(match total {
            None => l,
            Some(t) => (t + l).map_err(cerr)?,
        });
        wsum += w;
        hit += h1;
        n1 += c1;
    }
    Ok(match total {
        Some(t) if wsum > 0.0 => Some((
            (t / wsum as f64).map_err(cerr)?,
            hit as f64 / n1.max(1) as f64,
            rows,
        )),
        _ => None,
    })
}

/// Σ weight · loss over one sequence's scored rows, Σ weight, and depth-1 hits / count.
pub fn sequence_loss(
    net: &Net,
    head: &FrozenHead,
    lb: &Labeled,
    kl: f64,
) -> CResult<(Tensor, f32, usize, usize)> {
    let logits = net.forward(&lb.batch)?;
    let dev = logits.device();
    let target = match (kl > 0.0 || lb.teacher, &lb.target_hidden) {
        (true, Some(th)) => Some(head.target_logits(&th.to_device(dev)?)?),
        (true, None) if lb.teacher => {
            candle_core::bail!("teacher-forced text needs the target's last layer in the taps")
        }
        _ => None,
    };
    let teacher_labels;
    let labels = match (&target, lb.teacher) {
        (Some(t), true) => {
            teacher_labels = t.argmax(D::Minus1)?.to_vec1::<u32>()?;
            &teacher_labels
        }
        _ => &lb.labels,
    };
    let nll = crate::train::fused::cross_entropy_kl(&logits, labels, target.as_ref(), kl)?;
    let weights = lb.chain_weights(labels);
    let wsum: f32 = weights.iter().sum();
    let wt = Tensor::from_vec(weights, lb.weights.len(), dev)?;
    let loss = (nll * wt)?.sum_all()?;
    let am: Vec<u32> = logits.argmax(D::Minus1)?.to_vec1()?;
    let (mut hit, mut n) = (0, 0);
    for (r, &d) in lb.depth.iter().enumerate() {
        if d == 1 {
            n += 1;
            hit += (am[r] == labels[r]) as usize;
        }
    }
    Ok((loss, wsum, hit, n))
}

/// The target's head rows of the draft vocabulary with its final norm folded in (the fresh
/// drafter's LM head starts as the target's own, on normed inputs).
fn target_head_rows(target: &Model, vocab: &DraftVocab) -> Vec<f32> {
    let h = target.config.hidden_size;
    let norm = target.output_norm();
    let mut w = vec![0f32; vocab.len() * h];
    for (d, &t) in vocab.d2t.iter().enumerate() {
        let row = &mut w[d * h..(d + 1) * h];
        target.output_head().row_into(t as usize, row);
        row.iter_mut().zip(norm).for_each(|(a, b)| *a *= b);
    }
    w
}

/// The drafter shape for `target`: one layer of the target's dimensions, `draft_length` masks.
pub fn config_for(target: &Model, draft_length: usize, draft_vocab: usize) -> DartConfig {
    let mut layer = target.config.clone();
    layer.arch = crate::model::Arch::Llama;
    layer.n_layers = 1;
    layer.rope_scaling = crate::model::config::RopeScaling::None;
    layer.rope_style = crate::runtime::ops::RopeStyle::Half;
    // One dense layer, whatever the target's MLP (a mixture of experts: one expert's width).
    layer.extras.moe = None;
    DartConfig {
        draft_length,
        draft_vocab_size: draft_vocab,
        target_hidden_size: target.config.hidden_size,
        layer,
    }
}

/// Trains (or resumes) in `dir`; `on_log` sees every step. Returns the trained net.
pub fn train(
    config: &DartConfig,
    data: &Data,
    p: &DartParams,
    dir: &Path,
    on_log: impl FnMut(&LogLine),
) -> Result<Net> {
    check_data(config, data)?;
    let ckpt = dir.join("checkpoint");
    let (net, mut opt, step, elapsed) = run::start(
        &ckpt,
        |n: &Net| &n.vars,
        |t| Net::from_tensors(config.clone(), t)?.to_device(&data.device),
        || {
            let head = target_head_rows(data.target, data.vocab);
            Net::init(config.clone(), p.schedule.seed, Some(head))
                .and_then(|n| n.to_device(&data.device))
                .map_err(cerr)
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
        &p.schedule,
        dir,
        |chunk, epoch| batch_loss(&net, &head, data, p, epoch, chunk),
        on_log,
    )?;
    Ok(net)
}

fn check_data(config: &DartConfig, data: &Data) -> Result<()> {
    let want = 3 * config.target_hidden_size;
    if data.features.ctx() != want || config.draft_vocab_size != data.vocab.len() {
        return Err(Error::BadRequest(format!(
            "DART training: features of width {} and a vocabulary of {} for a drafter of taps \
             width {want} and vocabulary {}",
            data.features.ctx(),
            data.vocab.len(),
            config.draft_vocab_size
        )));
    }
    Ok(())
}

/// Held-out chain acceptance over the drafter's depths: at up to `anchors` evenly spaced
/// prefixes per sample whose every depth lies in the response, the greedy drafts of depth
/// 1..=D against the target's tokens.
pub fn evaluate(net: &Net, data: &Data, held_out: &[usize], anchors: usize) -> Result<Eval> {
    check_data(&net.config, data)?;
    let masks = net.config.draft_length;
    let depths = masks + 1;
    let (mut hits, mut blocks) = (vec![0usize; depths], 0);
    for &si in held_out {
        let s = &data.samples[si];
        let full: Vec<usize> = valid_prefixes(s)
            .filter(|&g| g + 1 + depths < s.tokens.len())
            .collect();
        if full.is_empty() {
            continue;
        }
        let step = full.len().div_ceil(anchors.max(1)).max(1);
        let chosen: Vec<usize> = full.iter().copied().step_by(step).collect();
        let Some(mut lb) = build(data, si, &chosen, masks, 1.0).map_err(cerr)? else {
            continue;
        };
        // Score exactly the chain rows: clean slot g, then its masks.
        let clean = s.tokens.len() - 1;
        lb.batch.out = chosen
            .iter()
            .enumerate()
            .flat_map(|(a, &g)| {
                std::iter::once(g as u32)
                    .chain((0..masks).map(move |j| (clean + a * masks + j) as u32))
            })
            .collect();
        let am: Vec<u32> = net
            .forward(&lb.batch)
            .and_then(|l| l.argmax(D::Minus1))
            .and_then(|a| a.to_vec1())
            .map_err(cerr)?;
        for (a, &g) in chosen.iter().enumerate() {
            blocks += 1;
            for k in 0..depths {
                if data.vocab.d2t[am[a * depths + k] as usize] != s.tokens[g + 2 + k].0 {
                    break;
                }
                hits[k] += 1;
            }
        }
    }
    Ok(Eval::from_hits(depths, blocks, &hits))
}

/// Writes the drafter in the published layout: `config.json` + `model.safetensors` (weights
/// in `dtype` — F16, BF16 or F32 — the `d2t` offsets as I64 and the `t2d` mask as BOOL).
pub fn export(net: &Net, vocab: &DraftVocab, dir: &Path, dtype: DType) -> Result<()> {
    crate::train::export::write_drafter(&net.vars, Some(vocab), &net.config.to_json(), dir, dtype)
}

/// An exported (or published) DART drafter as a trainable network with its vocabulary.
pub fn load_exported(dir: &Path) -> Result<(Net, DraftVocab)> {
    let config = DartConfig::load(dir)?;
    let src = crate::model::source::SafetensorsSource::open(dir)?;
    let vocab = DraftVocab::load(
        &src,
        Some(config.draft_vocab_size),
        config.layer.vocab_size,
        "DART drafter",
    )?;
    // candle reads no BOOL tensors: take every float tensor through our own reader.
    let mut t = HashMap::new();
    for (name, shape) in Net::shapes(&config) {
        let v = src.f32_tensor(&name, &shape)?;
        t.insert(
            name,
            Tensor::from_vec(v, shape, &Device::Cpu).map_err(cerr)?,
        );
    }
    let net = Net::from_tensors(config, &t).map_err(cerr)?;
    Ok((net, vocab))
}

/// DART's taps plus the target's last layer: the rows its feature cache holds.
pub fn stored_taps(target: &Model) -> Result<Vec<usize>> {
    let mut t = dart_taps(target.config.n_layers)?;
    t.push(target.config.n_layers - 1);
    Ok(t)
}
