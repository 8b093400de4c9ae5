//! The optimisation loop every drafter trainer shares: seeded epoch shuffles, cosine schedule
//! with linear warm-up, gradient clipping, AdamW, a JSONL log, and resumable checkpoints
//! (weights, optimiser moments and the step, written atomically every few steps).

use super::optim::{cosine_lr, AdamW};
use crate::error::{Error, Result};
use candle_core::{Device, Tensor, Var};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Instant;

pub(crate) fn cerr(e: candle_core::Error) -> Error {
    Error::BadRequest(format!("training: {e}"))
}

/// Everything a trainer needs besides the network: the target, the self-distilled samples
/// with their cached target features, the training split and the draft vocabulary.
pub struct Data<'a> {
    pub target: &'a crate::model::Model,
    pub samples: &'a [crate::train::data::Sample],
    /// The drafter's taps (the context columns), then the target's last layer when kept:
    /// stored, or computed by the target as each step needs them.
    pub features: &'a crate::train::features::TapSource,
    pub train: Vec<usize>,
    pub vocab: &'a crate::drafters::vocab::DraftVocab,
    /// Where the drafter's tensors live (batches are built on the CPU and copied there).
    pub device: Device,
    /// Samples from this index on are teacher-forced text (corpus), not the target's own
    /// answers: a trainer labels them with the target's argmax and distribution (`samples.len()`
    /// when there are none).
    pub teacher_from: usize,
}

/// Up to `n` distinct items of `range` (all of them when `n` is 0), uniformly without
/// replacement, sorted.
pub fn sample_sorted(range: std::ops::Range<usize>, n: usize, rng: &mut ChaCha8Rng) -> Vec<usize> {
    let mut all: Vec<usize> = range.collect();
    let k = if n == 0 { all.len() } else { n.min(all.len()) };
    for i in 0..k {
        let j = i + (rng.next_u64() % (all.len() - i) as u64) as usize;
        all.swap(i, j);
    }
    all.truncate(k);
    all.sort_unstable();
    all
}

/// Trainable weights by checkpoint name.
pub type Vars = BTreeMap<String, Var>;

/// How long and how fast to train.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Schedule {
    /// Sequences per optimiser step.
    pub batch_seqs: usize,
    pub epochs: usize,
    /// Cap on optimiser steps (0: epochs decide).
    pub max_steps: usize,
    pub lr: f64,
    pub warmup_ratio: f64,
    pub grad_clip: f64,
    pub seed: u64,
    /// Steps between checkpoints.
    pub save_every: usize,
    /// Pause after this step (a checkpoint is written; a later run resumes). 0: run to the end.
    pub pause_at: usize,
}

/// One line of `train_log.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LogLine {
    pub step: usize,
    pub epoch: usize,
    pub loss: f64,
    /// Top-1 accuracy of the first draft position in this batch.
    pub acc1: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub secs: f64,
    pub elapsed_s: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct State {
    step: usize,
    elapsed_s: f64,
}

/// A saved checkpoint: every tensor (weights and optimiser moments), the step it was taken
/// at and the training seconds so far.
pub struct Saved {
    pub tensors: HashMap<String, Tensor>,
    pub step: usize,
    pub elapsed_s: f64,
}

/// Saves weights and optimiser moments (f32, on the CPU) plus the step counter.
pub fn save_checkpoint(
    dir: &Path,
    vars: &Vars,
    opt: &AdamW,
    step: usize,
    elapsed_s: f64,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut t = opt.state();
    for (k, v) in vars {
        t.insert(k.clone(), v.as_tensor().clone());
    }
    let cpu = &Device::Cpu;
    let t: HashMap<String, Tensor> = t
        .into_iter()
        .map(|(k, v)| Ok((k, v.to_device(cpu)?)))
        .collect::<candle_core::Result<_>>()
        .map_err(cerr)?;
    let tmp = dir.join("state.safetensors.tmp");
    candle_core::safetensors::save(&t, &tmp).map_err(cerr)?;
    std::fs::rename(&tmp, dir.join("state.safetensors")).map_err(|e| Error::io(dir, e))?;
    let js = serde_json::to_string(&State { step, elapsed_s }).expect("state serialises");
    std::fs::write(dir.join("state.json"), js).map_err(|e| Error::io(dir, e))
}

/// The checkpoint in `dir`, if it has one.
pub fn load_checkpoint(dir: &Path) -> Result<Option<Saved>> {
    let p = dir.join("state.safetensors");
    if !p.exists() {
        return Ok(None);
    }
    let broken = |why: String| Error::BadModelFile {
        path: p.clone(),
        format: "training checkpoint",
        reason: format!("{why} (move it away to start afresh)"),
    };
    let tensors =
        candle_core::safetensors::load(&p, &Device::Cpu).map_err(|e| broken(e.to_string()))?;
    let sp = dir.join("state.json");
    let js = std::fs::read_to_string(&sp).map_err(|e| Error::io(&sp, e))?;
    let st: State = serde_json::from_str(&js).map_err(|e| broken(format!("state.json: {e}")))?;
    Ok(Some(Saved {
        tensors,
        step: st.step,
        elapsed_s: st.elapsed_s,
    }))
}

/// What a run starts from: the network and optimiser of the checkpoint in `ckpt` when there is
/// one (`restore` rebuilds the network from its tensors; a misfit is reported as a broken
/// checkpoint), else `fresh()` with a new optimiser; with the step and training seconds so far.
pub fn start<N>(
    ckpt: &Path,
    vars_of: impl Fn(&N) -> &Vars,
    restore: impl FnOnce(&HashMap<String, Tensor>) -> candle_core::Result<N>,
    fresh: impl FnOnce() -> Result<N>,
) -> Result<(N, AdamW, usize, f64)> {
    match load_checkpoint(ckpt)? {
        Some(c) => {
            let net = restore(&c.tensors).map_err(|e| broken_checkpoint(ckpt, e))?;
            let mut opt = AdamW::new(vars_of(&net), 0.0).map_err(cerr)?;
            opt.load_state(&c.tensors, c.step).map_err(cerr)?;
            Ok((net, opt, c.step, c.elapsed_s))
        }
        None => {
            let net = fresh()?;
            let opt = AdamW::new(vars_of(&net), 0.0).map_err(cerr)?;
            Ok((net, opt, 0, 0.0))
        }
    }
}

/// Explains a checkpoint that does not fit the network being trained.
pub fn broken_checkpoint(dir: &Path, why: impl std::fmt::Display) -> Error {
    Error::BadModelFile {
        path: dir.join("state.safetensors"),
        format: "training checkpoint",
        reason: format!("{why} (move it away to start afresh)"),
    }
}

/// The sequence order of `epoch` (a seeded shuffle).
pub fn epoch_order(train: &[usize], seed: u64, epoch: usize) -> Vec<usize> {
    let mut v = train.to_vec();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (epoch as u64).wrapping_mul(0x9e37_79b9));
    for i in (1..v.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

/// Backward, clipping and one AdamW step; returns (loss, gradient norm before clipping).
pub fn optimise(
    vars: &Vars,
    opt: &mut AdamW,
    loss: &Tensor,
    lr: f64,
    clip: f64,
) -> Result<(f64, f64)> {
    let grads = loss.backward().map_err(cerr)?;
    let gn = AdamW::grad_norm(vars, &grads).map_err(cerr)?;
    let scale = if gn > clip { clip / gn } else { 1.0 };
    opt.step(vars, &grads, lr, scale).map_err(cerr)?;
    Ok((loss.to_scalar::<f32>().map_err(cerr)? as f64, gn))
}

/// The loss of one batch of sequences and the batch's first-position accuracy (`None`: the
/// batch has nothing labelled).
pub type BatchLoss = Option<(Tensor, f64)>;

/// Trains `vars` from `step` over the sequences `train` in `dir` (log and checkpoints there):
/// `loss(sequences, epoch)` gives each step's loss; `on_log` sees every step.
#[allow(clippy::too_many_arguments)]
pub fn train_loop(
    vars: &Vars,
    opt: &mut AdamW,
    mut step: usize,
    mut elapsed: f64,
    train: &[usize],
    sch: &Schedule,
    dir: &Path,
    mut loss: impl FnMut(&[usize], usize) -> Result<BatchLoss>,
    mut on_log: impl FnMut(&LogLine),
) -> Result<()> {
    let bs = sch.batch_seqs.max(1);
    let per_epoch = train.len().div_ceil(bs).max(1);
    let mut total = per_epoch * sch.epochs;
    if sch.max_steps > 0 {
        total = total.min(sch.max_steps);
    }
    let warmup = ((total as f64 * sch.warmup_ratio).ceil() as usize).max(1);
    let log_path = dir.join("train_log.jsonl");
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| Error::io(&log_path, e))?;
    let ckpt = dir.join("checkpoint");
    let mut order: (usize, Vec<usize>) = (usize::MAX, vec![]); // (epoch, its sequence order)
    while step < total {
        let (epoch, in_epoch) = (step / per_epoch, step % per_epoch);
        if order.0 != epoch {
            order = (epoch, epoch_order(train, sch.seed, epoch));
        }
        let o = &order.1;
        let chunk = &o[(in_epoch * bs).min(o.len())..((in_epoch + 1) * bs).min(o.len())];
        let t0 = Instant::now();
        let lr = cosine_lr(step, total, warmup, sch.lr);
        let (lv, acc1, gn) = match loss(chunk, epoch)? {
            None => (0.0, 0.0, 0.0),
            Some((l, acc1)) => {
                let (lv, gn) = optimise(vars, opt, &l, lr, sch.grad_clip)?;
                (lv, acc1, gn)
            }
        };
        let secs = t0.elapsed().as_secs_f64();
        elapsed += secs;
        step += 1;
        let line = LogLine {
            step,
            epoch,
            loss: lv,
            acc1,
            lr,
            grad_norm: gn,
            secs,
            elapsed_s: elapsed,
        };
        use std::io::Write;
        writeln!(log, "{}", serde_json::to_string(&line).expect("log line"))
            .map_err(|e| Error::io(&log_path, e))?;
        on_log(&line);
        let pause = step == sch.pause_at;
        if step.is_multiple_of(sch.save_every.max(1)) || step == total || pause {
            save_checkpoint(&ckpt, vars, opt, step, elapsed)?;
        }
        if pause {
            break;
        }
    }
    Ok(())
}

/// Held-out acceptance of a chain of drafts: `acc[k−1]` = fraction of positions whose first
/// k drafts all equal the target's tokens (per-depth acceptance α_k = acc[k−1] / acc[k−2]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Eval {
    /// Drafts per position (DFlash: block size; DART: depths).
    pub block_size: usize,
    pub blocks: usize,
    pub acc: Vec<f64>,
    pub alpha: Vec<f64>,
    /// 1 + Σ acc: tokens per target pass with greedy chain verification.
    pub expected_tau: f64,
}

impl std::fmt::Display for Eval {
    /// `N positions, chain of B: expected τ X, α [..]` (α to three decimals).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let alpha: Vec<f64> = self
            .alpha
            .iter()
            .map(|x| (x * 1000.0).round() / 1000.0)
            .collect();
        write!(
            f,
            "{} positions, chain of {}: expected τ {:.3}, α {alpha:?}",
            self.blocks, self.block_size, self.expected_tau
        )
    }
}

impl Eval {
    /// From the count of positions whose first k drafts all matched (`hits[k − 1]`).
    pub fn from_hits(block_size: usize, blocks: usize, hits: &[usize]) -> Self {
        let acc: Vec<f64> = hits
            .iter()
            .map(|&h| h as f64 / blocks.max(1) as f64)
            .collect();
        let alpha = acc
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let prev = if i == 0 { 1.0 } else { acc[i - 1] };
                if prev > 0.0 {
                    a / prev
                } else {
                    0.0
                }
            })
            .collect();
        Eval {
            block_size,
            blocks,
            expected_tau: 1.0 + acc.iter().sum::<f64>(),
            acc,
            alpha,
        }
    }
}
