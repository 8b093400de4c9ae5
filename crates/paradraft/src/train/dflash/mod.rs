//! DFlash drafter training (DFlash §4 "Training", docs/dflash.md): self-distilled sequences, cached
//! target features, random anchor blocks with block-sparse attention, position-decayed
//! cross-entropy, AdamW with cosine warm-up, gradient clipping, resumable checkpoints, a
//! held-out acceptance evaluation and export in the published checkpoint format.

pub mod batch;
pub mod net;
pub mod pipeline;

use crate::drafters::dflash::DflashConfig;
use crate::drafters::vocab::DraftVocab;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::train::optim::AdamW;
use crate::train::run;
use crate::types::TokenId;
use batch::{build, sample_anchors, valid_anchors};
use candle_core::{DType, Device, Tensor, D};
use net::{CResult, FrozenHead, Net};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

pub(crate) use crate::train::run::cerr;
pub use crate::train::run::{Eval, LogLine};

/// Hyper-parameters (defaults: the paper's where the CPU budget allows; see the README).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrainParams {
    pub block_size: usize,
    /// Anchors per sequence, resampled each epoch (paper: up to 512).
    pub anchors: usize,
    /// Sequences per optimiser step.
    pub batch_seqs: usize,
    pub epochs: usize,
    /// Cap on optimiser steps (0: epochs decide).
    pub max_steps: usize,
    pub lr: f64,
    pub warmup_ratio: f64,
    pub grad_clip: f64,
    /// Loss decay: weight exp(−(k − 1)/γ) for the k-th draft.
    pub gamma: f32,
    /// Weight of the KL term against the target's distribution (0: cross-entropy only).
    #[serde(default)]
    pub kl_weight: f64,
    /// Draft layer i starts from target layer `init_layers[i]` (empty: random weights).
    #[serde(default)]
    pub init_layers: Vec<usize>,
    /// Start from this exported drafter's weights (fine-tuning on new data); its shape must be
    /// the run's. Its draft vocabulary is not kept: the head is the target's, restricted to the
    /// run's vocabulary, so the trained weights carry over whatever the vocabulary.
    #[serde(default)]
    pub init_from: Option<std::path::PathBuf>,
    pub seed: u64,
    /// Steps between checkpoints.
    pub save_every: usize,
    /// Pause after this step (a checkpoint is written; a later run resumes). 0: run to the end.
    pub pause_at: usize,
}

impl TrainParams {
    /// The shared loop's part of these parameters.
    pub fn schedule(&self) -> run::Schedule {
        run::Schedule {
            batch_seqs: self.batch_seqs,
            epochs: self.epochs,
            max_steps: self.max_steps,
            lr: self.lr,
            warmup_ratio: self.warmup_ratio,
            grad_clip: self.grad_clip,
            seed: self.seed,
            save_every: self.save_every,
            pause_at: self.pause_at,
        }
    }
}

impl Default for TrainParams {
    fn default() -> Self {
        TrainParams {
            block_size: 16,
            anchors: 48,
            batch_seqs: 4,
            epochs: 3,
            max_steps: 0,
            lr: 6e-4,
            warmup_ratio: 0.04,
            grad_clip: 1.0,
            gamma: 7.0,
            kl_weight: 0.0,
            init_layers: vec![],
            init_from: None,
            seed: 0,
            save_every: 50,
            pause_at: 0,
        }
    }
}

pub use crate::train::run::Data;

/// The training device named by `name`: `cpu`, `cuda` or `cuda:N`. A CUDA device on a build
/// without the `cuda` feature, or on a machine without one, is a clear error.
pub fn device(name: &str) -> Result<Device> {
    let bad = |why: String| Error::BadRequest(format!("device {name:?}: {why}"));
    match name {
        "cpu" => Ok(Device::Cpu),
        _ => {
            let ord = match name.strip_prefix("cuda") {
                Some("") => 0,
                Some(r) => r
                    .strip_prefix(':')
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| bad("want cpu, cuda or cuda:N".into()))?,
                None => return Err(bad("want cpu, cuda or cuda:N".into())),
            };
            if !candle_core::utils::cuda_is_available() {
                return Err(bad(
                    "this build has no CUDA support (build with `--features cuda`)".into(),
                ));
            }
            Device::new_cuda(ord).map_err(|e| bad(format!("no such CUDA device ({e})")))
        }
    }
}

/// The target's head rows of the draft vocabulary, f32, frozen.
pub fn frozen_head(target: &Model, vocab: &DraftVocab) -> CResult<FrozenHead> {
    let h = target.config.hidden_size;
    let head = target.output_head();
    let mut w = vec![0f32; vocab.len() * h];
    for (d, &t) in vocab.d2t.iter().enumerate() {
        head.row_into(t as usize, &mut w[d * h..(d + 1) * h]);
    }
    FrozenHead::new(Tensor::from_vec(w, (vocab.len(), h), &Device::Cpu)?)?
        .with_target_norm(target.output_norm(), target.config.rms_eps)
}

/// Weighted loss over labelled rows and the first-slot accuracy; `None` when the batch has no
/// labelled row. Each row's loss is the cross-entropy of its label plus `kl` times the KL
/// divergence from the target's distribution (restricted to the draft vocabulary) to the
/// drafter's, when the batch carries the target's last-layer outputs. Teacher-forced rows take
/// the target's argmax as their label, along the greedy path only ([`batch::Labeled::relabel`]).
pub fn loss(
    net: &Net,
    head: &FrozenHead,
    lb: &batch::Labeled,
    kl: f64,
) -> CResult<Option<(Tensor, f64)>> {
    let Some(b) = lb.batches.first().map(|x| x.block) else {
        return Ok(None);
    };
    let rows: Vec<u32> = (0..lb.labels.len() as u32)
        .filter(|&i| lb.weights[i as usize] > 0.0)
        .collect();
    if rows.is_empty() {
        return Ok(None);
    }
    let teacher = lb.has_teacher();
    let target = match (kl > 0.0 || teacher, &lb.target_hidden) {
        (true, Some(th)) => {
            let idx_rows = Tensor::from_vec(rows.clone(), rows.len(), th.device())?;
            Some(head.target_logits(&th.index_select(&idx_rows, 0)?.to_device(net.device())?)?)
        }
        (true, None) if teacher => {
            candle_core::bail!("teacher-forced text needs the target's last layer in the taps")
        }
        _ => None,
    };
    let (labels, weights) = match (&target, teacher) {
        (Some(t), true) => {
            let am: Vec<u32> = t.argmax(D::Minus1)?.to_vec1()?;
            let mut at = vec![None; lb.labels.len()];
            for (r, &i) in rows.iter().enumerate() {
                at[i as usize] = Some(am[r]);
            }
            lb.relabel(b, |i| at[i])
        }
        _ => (lb.labels.clone(), lb.weights.clone()),
    };
    // Rows the relabelling left unweighted stay in the product (their weight is 0).
    let w: Vec<f32> = rows.iter().map(|&i| weights[i as usize]).collect();
    let wsum: f32 = w.iter().sum();
    if wsum <= 0.0 {
        return Ok(None);
    }
    let hs = lb
        .batches
        .iter()
        .map(|x| net.forward(x))
        .collect::<CResult<Vec<_>>>()?;
    let hidden = Tensor::cat(&hs, 0)?;
    // Row i of the labels is slot (i mod (B−1)) + 1 of block i / (B−1).
    let slot = |i: u32| {
        let (j, k) = (i as usize / (b - 1), i as usize % (b - 1) + 1);
        (j * b + k) as u32
    };
    let dev = hidden.device();
    let idx = Tensor::from_vec(
        rows.iter().map(|&i| slot(i)).collect::<Vec<_>>(),
        rows.len(),
        dev,
    )?;
    let logits = head.forward(&hidden.index_select(&idx, 0)?.contiguous()?)?;
    let lab: Vec<u32> = rows.iter().map(|&i| labels[i as usize]).collect();
    let kl_target = if kl > 0.0 { target.as_ref() } else { None };
    let nll = crate::train::fused::cross_entropy_kl(&logits, &lab, kl_target, kl)?;
    let wt = Tensor::from_vec(w.clone(), rows.len(), dev)?;
    let loss = ((nll * wt)?.sum_all()? / wsum as f64)?;
    // First-slot accuracy (a cheap progress signal).
    let am: Vec<u32> = logits.argmax(D::Minus1)?.to_vec1()?;
    let (mut hit, mut n) = (0, 0);
    for (r, &i) in rows.iter().enumerate() {
        if (i as usize).is_multiple_of(b - 1) && w[r] > 0.0 {
            n += 1;
            hit += (am[r] == lab[r]) as usize;
        }
    }
    Ok(Some((loss, hit as f64 / n.max(1) as f64)))
}

/// A loaded checkpoint: the network, all saved tensors (optimiser moments included), the
/// step it was taken at and the training seconds so far.
pub struct Checkpoint {
    pub net: Net,
    pub tensors: HashMap<String, Tensor>,
    pub step: usize,
    pub elapsed_s: f64,
}

/// Loads a checkpoint written by [`train`], if `dir` has one.
pub fn load_checkpoint(dir: &Path, config: &DflashConfig) -> Result<Option<Checkpoint>> {
    let Some(saved) = run::load_checkpoint(dir)? else {
        return Ok(None);
    };
    let net = Net::from_tensors(config.clone(), &saved.tensors)
        .map_err(|e| run::broken_checkpoint(dir, e))?;
    Ok(Some(Checkpoint {
        net,
        tensors: saved.tensors,
        step: saved.step,
        elapsed_s: saved.elapsed_s,
    }))
}

/// A new network: random, its layers taken from target layers (`p.init_layers`), or an
/// exported drafter's weights (`p.init_from`).
fn fresh_net(config: &DflashConfig, target: &Model, p: &TrainParams) -> Result<Net> {
    if let Some(dir) = &p.init_from {
        if !p.init_layers.is_empty() {
            return Err(Error::BadRequest(
                "initialise from a drafter or from target layers, not both".into(),
            ));
        }
        let (mut net, _) = load_exported(dir, config.layers.vocab_size)?;
        check_fits(&net.config, config).map_err(|why| {
            Error::BadRequest(format!(
                "the drafter in {} cannot start this run: {why}",
                dir.display()
            ))
        })?;
        net.config = config.clone();
        return Ok(net);
    }
    if p.init_layers.is_empty() {
        return Net::init(config.clone(), p.seed).map_err(cerr);
    }
    if p.init_layers.len() != config.layers.n_layers {
        return Err(Error::BadRequest(format!(
            "{} init layers for a drafter of {} layers",
            p.init_layers.len(),
            config.layers.n_layers
        )));
    }
    Net::init_from_target(config.clone(), p.seed, target, &p.init_layers)
        .map(|(n, _)| n)
        .map_err(cerr)
}

/// Why a drafter of configuration `have` cannot be trained as `want` (`Ok`: it can).
fn check_fits(have: &DflashConfig, want: &DflashConfig) -> std::result::Result<(), String> {
    let (h, w) = (&have.layers, &want.layers);
    let shape = |c: &crate::model::Config| {
        (
            c.n_layers,
            c.hidden_size,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            c.intermediate_size,
        )
    };
    if shape(h) != shape(w) {
        return Err(format!(
            "layers, hidden, heads, KV heads, head dim, FFN {:?}, the run wants {:?}",
            shape(h),
            shape(w)
        ));
    }
    if have.target_layer_ids != want.target_layer_ids
        || have.num_target_layers != want.num_target_layers
    {
        return Err(format!(
            "it taps layers {:?} of a {}-layer target, the run {:?} of {}",
            have.target_layer_ids,
            have.num_target_layers,
            want.target_layer_ids,
            want.num_target_layers
        ));
    }
    if (have.block_size, have.mask_token_id) != (want.block_size, want.mask_token_id) {
        return Err(format!(
            "block {} with mask token {}, the run block {} with mask token {}",
            have.block_size, have.mask_token_id, want.block_size, want.mask_token_id
        ));
    }
    Ok(())
}

/// Trains (or resumes) in `dir`; calls `on_log` after every step. Returns the trained net.
pub fn train(
    config: &DflashConfig,
    data: &Data,
    p: &TrainParams,
    dir: &Path,
    on_log: impl FnMut(&LogLine),
) -> Result<Net> {
    let ckpt = dir.join("checkpoint");
    let (net, mut opt, step, elapsed) = match load_checkpoint(&ckpt, config)? {
        Some(c) => {
            let c = Checkpoint {
                net: c.net.to_device(&data.device).map_err(cerr)?,
                ..c
            };
            let mut opt = AdamW::new(&c.net.vars, 0.0).map_err(cerr)?;
            opt.load_state(&c.tensors, c.step).map_err(cerr)?;
            (c.net, opt, c.step, c.elapsed_s)
        }
        None => {
            let net = fresh_net(config, data.target, p)?
                .to_device(&data.device)
                .map_err(cerr)?;
            let opt = AdamW::new(&net.vars, 0.0).map_err(cerr)?;
            (net, opt, 0, 0.0)
        }
    };
    let head = frozen_head(data.target, data.vocab)
        .and_then(|h| h.to_device(&data.device))
        .map_err(cerr)?;
    run::train_loop(
        &net.vars,
        &mut opt,
        step,
        elapsed,
        &data.train,
        &p.schedule(),
        dir,
        |chunk, epoch| batch_loss(&net, &head, data, p, epoch, chunk).map(|(l, _)| l),
        on_log,
    )?;
    Ok(net)
}

/// The anchors of sequence `si` in `epoch` (a seeded draw, so a resumed run redraws them).
fn epoch_anchors(data: &Data, p: &TrainParams, epoch: usize, si: usize) -> Vec<usize> {
    let mut rng = ChaCha8Rng::seed_from_u64(
        p.seed ^ ((epoch as u64) << 32) ^ (si as u64).wrapping_mul(0x51_7cc1),
    );
    sample_anchors(&data.samples[si], p.anchors, &mut rng)
}

/// The loss of the sequences `chunk` (anchors drawn for `epoch`) and the block positions it
/// covers.
fn batch_loss(
    net: &Net,
    head: &FrozenHead,
    data: &Data,
    p: &TrainParams,
    epoch: usize,
    chunk: &[usize],
) -> Result<(run::BatchLoss, usize)> {
    let items: Vec<(usize, Vec<usize>)> = chunk
        .iter()
        .map(|&si| (si, epoch_anchors(data, p, epoch, si)))
        .collect();
    let positions = items.iter().map(|(_, a)| a.len() * p.block_size).sum();
    let lb = build(
        data.target,
        data.samples,
        data.features,
        &items,
        p.block_size,
        TokenId(net.config.mask_token_id),
        data.vocab,
        p.gamma,
        data.teacher_from,
    )
    .map_err(cerr)?;
    Ok((loss(net, head, &lb, p.kl_weight).map_err(cerr)?, positions))
}

/// Training throughput of this recipe: `steps` optimiser steps (after one warm-up step) on a
/// fresh network, nothing saved. Positions are block slots (sequences × anchors × block).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchResult {
    pub steps: usize,
    pub secs_per_step: f64,
    pub positions_per_step: f64,
    pub positions_per_s: f64,
}

pub fn bench(
    config: &DflashConfig,
    data: &Data,
    p: &TrainParams,
    steps: usize,
) -> Result<BenchResult> {
    let net = fresh_net(config, data.target, p)?
        .to_device(&data.device)
        .map_err(cerr)?;
    let mut opt = AdamW::new(&net.vars, 0.0).map_err(cerr)?;
    let head = frozen_head(data.target, data.vocab)
        .and_then(|h| h.to_device(&data.device))
        .map_err(cerr)?;
    let order = run::epoch_order(&data.train, p.seed, 0);
    let mut chunks = order.chunks(p.batch_seqs).cycle();
    let (mut secs, mut positions) = (0.0, 0usize);
    for i in 0..=steps {
        let chunk = chunks.next().unwrap_or(&[]);
        let t0 = Instant::now();
        let (l, n) = batch_loss(&net, &head, data, p, 0, chunk)?;
        if let Some((l, _)) = l {
            run::optimise(&net.vars, &mut opt, &l, 1e-4, p.grad_clip)?;
        }
        if i > 0 {
            secs += t0.elapsed().as_secs_f64();
            positions += n;
        }
    }
    Ok(BenchResult {
        steps,
        secs_per_step: secs / steps.max(1) as f64,
        positions_per_step: positions as f64 / steps.max(1) as f64,
        positions_per_s: positions as f64 / secs.max(1e-9),
    })
}

/// Evaluates on `held_out` samples: up to `anchors` anchors each whose whole block lies in
/// the response.
pub fn evaluate(
    net: &Net,
    data: &Data,
    held_out: &[usize],
    block: usize,
    anchors: usize,
) -> Result<Eval> {
    let head = frozen_head(data.target, data.vocab)
        .and_then(|h| h.to_device(net.device()))
        .map_err(cerr)?;
    let mut hits = vec![0usize; block - 1];
    let mut blocks = 0;
    for &si in held_out {
        let s = &data.samples[si];
        let full: Vec<usize> = valid_anchors(s)
            .filter(|&a| a + block - 1 < s.tokens.len())
            .collect();
        if full.is_empty() {
            continue;
        }
        // Evenly spaced anchors (deterministic).
        let step = full.len().div_ceil(anchors).max(1);
        let chosen: Vec<usize> = full.iter().copied().step_by(step).collect();
        let lb = build(
            data.target,
            data.samples,
            data.features,
            &[(si, chosen.clone())],
            block,
            TokenId(net.config.mask_token_id),
            data.vocab,
            1.0,
            usize::MAX,
        )
        .map_err(cerr)?;
        let hidden = net.forward(&lb.batches[0]).map_err(cerr)?;
        let logits = head.forward(&hidden).map_err(cerr)?;
        let am: Vec<u32> = logits
            .argmax(D::Minus1)
            .map_err(cerr)?
            .to_vec1()
            .map_err(cerr)?;
        for (j, &a) in chosen.iter().enumerate() {
            blocks += 1;
            for k in 1..block {
                let want = s.tokens[a + k];
                if data.vocab.d2t[am[j * block + k] as usize] != want.0 {
                    break;
                }
                hits[k - 1] += 1;
            }
        }
    }
    Ok(Eval::from_hits(block, blocks, &hits))
}

/// A drafter exported by [`export`] (or any published DFlash checkpoint) as a trainable
/// network with its draft vocabulary, to evaluate it on another run's held-out samples.
pub fn load_exported(dir: &Path, target_vocab: usize) -> Result<(Net, DraftVocab)> {
    let config = DflashConfig::load(dir)?;
    let src = crate::model::source::SafetensorsSource::open(dir)?;
    let vocab = DraftVocab::load(
        &src,
        config.draft_vocab_size,
        target_vocab,
        "DFlash drafter",
    )?;
    let p = dir.join("model.safetensors");
    let t = candle_core::safetensors::load(&p, &Device::Cpu).map_err(cerr)?;
    let net = Net::from_tensors(config, &t).map_err(cerr)?;
    Ok((net, vocab))
}

/// Writes the drafter in the published layout: `config.json` + `model.safetensors` (weights
/// in `dtype`, plus `d2t` when the vocabulary is reduced).
pub fn export(
    net: &Net,
    vocab: &DraftVocab,
    target_vocab: usize,
    dir: &Path,
    dtype: DType,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut config = net.config.clone();
    let mut t = HashMap::new();
    for (k, v) in &net.vars {
        let x = v
            .as_tensor()
            .to_device(&Device::Cpu)
            .and_then(|x| x.to_dtype(dtype));
        t.insert(k.clone(), x.map_err(cerr)?);
    }
    if vocab.len() < target_vocab {
        config.draft_vocab_size = Some(vocab.len());
        t.insert(
            "d2t".to_string(),
            Tensor::from_vec(vocab.offsets(), vocab.len(), &Device::Cpu).map_err(cerr)?,
        );
    } else {
        config.draft_vocab_size = None;
    }
    candle_core::safetensors::save(&t, dir.join("model.safetensors")).map_err(cerr)?;
    let js = serde_json::to_string_pretty(&config.to_json()).expect("config serialises");
    std::fs::write(dir.join("config.json"), js + "\n").map_err(|e| Error::io(dir, e))
}
