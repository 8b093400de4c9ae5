//! `paradraft train dflash`: self-distillation data → cached target features → training →
//! held-out evaluation → an exported drafter. Every stage resumes from what `--out` holds.

use crate::{load, ModelArgs};
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use paradraft::drafters::dflash::{default_target_layers, DflashConfig};
use paradraft::drafters::vocab::DraftVocab;
use paradraft::model::Arch;
use paradraft::train::data::{distill, read_prompts, DistillParams};
use paradraft::train::dflash::{bench, evaluate, export, train, Data, TrainParams};
use paradraft::train::features;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum TrainCmd {
    /// Train a DFlash block-diffusion drafter for the target (DFlash paper §4).
    Dflash(DflashArgs),
    /// Train a DART one-layer parallel drafter for the target (DART paper §3.4, App. B).
    Dart(crate::train_dart::DartArgs),
    /// Train a PARD mask-token parallel draft model from the target's first layers (PARD
    /// paper §3.2: conditional drop-token training; no target features).
    Pard(crate::train_mask::PardArgs),
    /// Train a DiffuSpec diffusion-LM drafter from the target's first layers (DiffuSpec §4.1:
    /// masked diffusion, eq. 3; Dream's shifted logits; block-bidirectional attention).
    Dlm(crate::train_mask::DlmArgs),
    /// Start or resume the DART training campaign that accrues across sessions: online teacher
    /// forcing on self-distilled samples and corpus text, checkpoints under
    /// $HOME/.cache/paradraft/campaign, a held-out curve (safe to kill at any moment).
    Campaign(crate::train_campaign::CampaignArgs),
}

/// What every drafter trainer shares: the target, the working directory, self-distillation,
/// the held-out split and the draft vocabulary.
#[derive(Args)]
pub struct DataArgs {
    #[command(flatten)]
    pub m: ModelArgs,
    /// Working directory: samples.bin, features, checkpoints, log, and the exported drafter.
    #[arg(long)]
    pub out: PathBuf,
    /// Training prompts (JSON Lines with "id" and "prompt"; `.gz` is read compressed).
    #[arg(long, default_value = "data/train/distill_prompts.jsonl.gz")]
    pub prompts: PathBuf,
    /// Sequences self-distilled at once (continuous batching; 1 is single-stream).
    #[arg(long, default_value_t = 16)]
    pub gen_seqs: usize,
    /// Self-distilled samples to generate (held-out evaluation takes the last 5 %).
    #[arg(long, default_value_t = 1000)]
    pub samples: usize,
    /// Longest target response per sample.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Stop after this stage.
    #[arg(long, value_enum)]
    pub until: Option<Stage>,
    /// Reduced draft vocabulary: the N most frequent response tokens (0: the full vocabulary).
    #[arg(long, default_value_t = 8192)]
    pub draft_vocab: usize,
    /// Prompts (JSON Lines with "prompt") to leave out of the held-out evaluation, e.g. the
    /// prompts a drafter given to --init-from or --evaluate was trained on.
    #[arg(long)]
    pub eval_exclude: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where the drafter trains: cpu, cuda or cuda:N (a CUDA device needs a `--features cuda`
    /// build); batches and target features are made on the CPU and copied there.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

#[derive(Args)]
pub struct DflashArgs {
    #[command(flatten)]
    pub d: DataArgs,
    /// Draft decoder layers.
    #[arg(long, default_value_t = 1)]
    pub draft_layers: usize,
    /// Target layers to fuse, spread from layer 1 to L−3 (ignored with --target-layers).
    #[arg(long, default_value_t = 5)]
    pub num_features: usize,
    /// Explicit target layers (0-based, comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub target_layers: Option<Vec<usize>>,
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Target embedding row for the mask slots (default: the lowest id absent from the data).
    #[arg(long)]
    pub mask_token_id: Option<u32>,
    /// Anchors per sequence, resampled every epoch.
    #[arg(long, default_value_t = 48)]
    pub anchors: usize,
    /// Sequences per optimiser step.
    #[arg(long, default_value_t = 4)]
    pub batch_seqs: usize,
    #[arg(long, default_value_t = 3)]
    pub epochs: usize,
    /// Cap on optimiser steps (0: epochs decide).
    #[arg(long, default_value_t = 0)]
    pub max_steps: usize,
    #[arg(long, default_value_t = 6e-4)]
    pub lr: f64,
    /// Weight of the KL divergence from the target's distribution (over the draft vocabulary)
    /// added to the cross-entropy of the target's token (0: cross-entropy only).
    #[arg(long, default_value_t = 0.0)]
    pub kl_weight: f64,
    /// Initialise the draft layers from the target's last layers instead of random weights.
    #[arg(long)]
    pub init_from_target: bool,
    /// Fine-tune: start from this exported drafter's weights. Its layers, block size, taps and
    /// mask token are used (the matching options are ignored); the draft vocabulary is this
    /// run's own.
    #[arg(long)]
    pub init_from: Option<PathBuf>,
    /// Evaluate this exported drafter on this run's held-out samples (the same split as the
    /// run's own evaluation) and exit instead of training.
    #[arg(long)]
    pub evaluate: Option<PathBuf>,
    /// Measure training throughput over this many steps (fresh weights, nothing saved) and
    /// exit instead of training.
    #[arg(long)]
    pub bench: Option<usize>,
    /// Where the drafter is written (default: OUT/drafter).
    #[arg(long)]
    pub export: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Stage {
    Data,
    Features,
    Train,
    Eval,
}

/// The drafter's taps plus the target's last layer (the distillation loss's input).
fn stored_taps(taps: &[usize], n_layers: usize) -> Vec<usize> {
    let mut t = taps.to_vec();
    t.push(n_layers - 1);
    t
}

fn bar(total: usize, what: &str) -> ProgressBar {
    let b = ProgressBar::new(total as u64);
    b.set_style(
        ProgressStyle::with_template(&format!(
            "{what} {{bar:40}} {{pos}}/{{len}} [{{elapsed_precise}} < {{eta_precise}}]"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    b
}

/// Keeps freed training tensors in the heap for reuse: glibc otherwise maps and unmaps every
/// large tensor, and the kernel zeroes fresh pages on each step (about 13 % of a DFlash
/// training step's time in `perf`; +4 %, +19 % and +30 % positions/s in three interleaved
/// `train dflash --bench` pairs on a noisy VM).
fn keep_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator thresholds; called before any training tensor.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_TOP_PAD, 256 << 20);
    }
}

/// The largest DFlash block `train dflash` accepts.
const MAX_BLOCK: usize = 128;
/// The most steps `--bench` times.
const MAX_BENCH_STEPS: usize = 10_000;

pub fn run(cmd: TrainCmd) -> Result<()> {
    keep_freed_memory();
    match cmd {
        TrainCmd::Dflash(a) => dflash(a),
        TrainCmd::Dart(a) => crate::train_dart::run(a),
        TrainCmd::Pard(a) => crate::train_mask::run_pard(a),
        TrainCmd::Dlm(a) => crate::train_mask::run_dlm(a),
        TrainCmd::Campaign(a) => crate::train_campaign::run(a),
    }
}

/// The self-distilled data of a run, its split and its draft vocabulary.
pub struct Prepared {
    pub lm: paradraft::model::Loaded,
    pub samples: Vec<paradraft::train::data::Sample>,
    pub train_idx: Vec<usize>,
    pub eval_idx: Vec<usize>,
    pub vocab: DraftVocab,
}

/// Self-distillation (capturing the `stored` taps as it generates), the held-out split (the
/// last 5 %, minus --eval-exclude prompts) and the draft vocabulary. `None` after
/// `--until data`. `taps_for(target)` names the layers to store.
pub fn prepare(
    a: &DataArgs,
    taps_for: impl FnOnce(&paradraft::model::Model) -> Result<Vec<usize>>,
) -> Result<Option<(Prepared, Vec<usize>)>> {
    std::fs::create_dir_all(&a.out)?;
    let (lm, _) = load(&a.m)?;
    let prompts = read_prompts(&a.prompts)?;
    let stored = taps_for(&lm.model)?;
    let tc = &lm.model.config;
    if let Some(&t) = stored.iter().find(|&&t| t >= tc.n_layers) {
        bail!("target layer {t} does not exist ({} layers)", tc.n_layers);
    }
    let pb = bar(a.samples, "self-distillation");
    let t0 = std::time::Instant::now();
    let mut first = None;
    let samples = distill(
        &lm.model,
        &lm.tokenizer,
        &prompts,
        &a.out.join("samples.bin"),
        &DistillParams {
            samples: a.samples,
            max_new_tokens: a.max_new_tokens,
            max_prompt_tokens: 1024,
            seqs: a.gen_seqs.max(1),
            // The drafter's features come with the generation (no second target pass).
            capture: (!stored.is_empty())
                .then(|| (stored.clone(), features::cache_path(&a.out, &stored))),
        },
        |d, _| {
            first.get_or_insert(d);
            pb.set_position(d as u64)
        },
    )?;
    pb.finish();
    if samples.len() < 2 {
        bail!(
            "{} training sample(s) in {}: need at least 2 (one is held out); check --prompts {}",
            samples.len(),
            a.out.join("samples.bin").display(),
            a.prompts.display()
        );
    }
    let secs = t0.elapsed().as_secs_f64();
    let toks: usize = samples.iter().map(|s| s.tokens.len()).sum();
    let new = &samples[first.unwrap_or(0).min(samples.len())..];
    if !new.is_empty() {
        let resp: usize = new
            .iter()
            .map(|s| s.tokens.len() - s.prompt_len as usize)
            .sum();
        let all: usize = new.iter().map(|s| s.tokens.len()).sum();
        eprintln!(
            "self-distilled {} samples in {secs:.1} s: {:.1} response tokens/s ({:.1} tokens/s with prompts), {} sequences at once",
            new.len(),
            resp as f64 / secs,
            all as f64 / secs,
            a.gen_seqs.max(1)
        );
    }
    eprintln!("{} samples, {toks} tokens", samples.len());
    if a.until == Some(Stage::Data) {
        return Ok(None);
    }
    // Held-out split: the last 5 % of the samples (at least one).
    let n_eval = (samples.len() / 20)
        .max(1)
        .min(samples.len().saturating_sub(1));
    let train_idx: Vec<usize> = (0..samples.len() - n_eval).collect();
    let mut eval_idx: Vec<usize> = (samples.len() - n_eval..samples.len()).collect();
    if let Some(path) = &a.eval_exclude {
        let seen: std::collections::HashSet<String> =
            read_prompts(path)?.into_iter().map(|p| p.prompt).collect();
        let before = eval_idx.len();
        eval_idx.retain(|&i| {
            prompts
                .get(samples[i].prompt_index as usize)
                .is_none_or(|p| !seen.contains(&p.prompt))
        });
        eprintln!(
            "held-out: {} of {before} samples kept ({} prompts appear in {})",
            eval_idx.len(),
            before - eval_idx.len(),
            path.display()
        );
        if eval_idx.is_empty() {
            bail!("every held-out prompt appears in {}", path.display());
        }
    }
    let vocab = if a.draft_vocab == 0 || a.draft_vocab >= tc.vocab_size {
        DraftVocab::full(tc.vocab_size)
    } else {
        let train_samples: Vec<_> = train_idx.iter().map(|&i| samples[i].clone()).collect();
        DraftVocab::most_frequent(&train_samples, tc.vocab_size, a.draft_vocab)
    };
    let held: Vec<_> = eval_idx.iter().map(|&i| samples[i].clone()).collect();
    eprintln!(
        "draft vocabulary {} tokens, covering {:.2} % of held-out response tokens",
        vocab.len(),
        100.0 * vocab.coverage(&held)
    );
    Ok(Some((
        Prepared {
            lm,
            samples,
            train_idx,
            eval_idx,
            vocab,
        },
        stored,
    )))
}

/// A frozen embedding row for mask slots: the lowest id the target never sees in this data
/// and never emits to end a turn (SmolLM2: a rare special token).
pub fn unused_token(
    lm: &paradraft::model::Loaded,
    samples: &[paradraft::train::data::Sample],
) -> u32 {
    let n = lm.model.config.vocab_size;
    let mut seen = vec![false; n];
    for t in lm
        .tokenizer
        .stop_tokens
        .iter()
        .chain(lm.tokenizer.bos.iter())
    {
        seen[t.idx()] = true;
    }
    for s in samples {
        for t in &s.tokens {
            seen[t.idx()] = true;
        }
    }
    seen.iter().position(|&x| !x).unwrap_or(n - 1) as u32
}

/// The feature cache of `stored` taps for the prepared samples (computed where missing); its
/// first `ctx_width` floats per row are the drafter's context.
pub fn feature_cache(
    a: &DataArgs,
    prep: &Prepared,
    stored: &[usize],
    ctx_width: usize,
) -> Result<features::TapSource> {
    let fpath = features::cache_path(&a.out, stored);
    let pb = bar(prep.samples.len(), "target features");
    let feats = features::build(&prep.lm.model, &prep.samples, stored, &fpath, |d, _| {
        pb.set_position(d as u64)
    })?
    .with_context_width(ctx_width);
    pb.finish();
    Ok(feats.into())
}

fn dflash(a: DflashArgs) -> Result<()> {
    // A device that is not there is refused before anything is written.
    let device = paradraft::train::dflash::device(&a.d.device)?;
    if a.init_from.is_some() && a.init_from_target {
        bail!("--init-from and --init-from-target exclude each other");
    }
    // A drafter to fine-tune fixes the shape of the run.
    let init = match &a.init_from {
        Some(dir) => Some(DflashConfig::load(dir)?),
        None => None,
    };
    let mut taps = vec![];
    let Some((prep, stored)) = prepare(&a.d, |m| {
        taps = match (&init, &a.target_layers) {
            (Some(c), _) => c.target_layer_ids.clone(),
            (None, Some(t)) => t.clone(),
            (None, None) => default_target_layers(m.config.n_layers, a.num_features),
        };
        // The cache also keeps the target's last layer: the distillation loss scores it
        // with the target's head to get the target's distribution at every position.
        Ok(stored_taps(&taps, m.config.n_layers))
    })?
    else {
        return Ok(());
    };
    let Prepared {
        lm,
        samples,
        train_idx,
        eval_idx,
        vocab,
    } = &prep;
    let tc = &lm.model.config;
    let (draft_layers, block_size) = match &init {
        Some(c) => (c.layers.n_layers, c.block_size),
        None => (a.draft_layers, a.block_size),
    };
    let target = &lm.model;
    if block_size < 2 || draft_layers == 0 || a.anchors == 0 || a.batch_seqs == 0 {
        bail!("--block-size ≥ 2, --draft-layers, --anchors and --batch-seqs ≥ 1 are required");
    }
    if block_size > MAX_BLOCK {
        bail!("--block-size {block_size}: at most {MAX_BLOCK} (DFlash uses 16)");
    }
    if draft_layers > tc.n_layers {
        bail!(
            "--draft-layers {draft_layers}: a drafter deeper than its target ({} layers) cannot pay",
            tc.n_layers
        );
    }
    if a.bench.is_some_and(|s| s > MAX_BENCH_STEPS) {
        bail!("--bench: at most {MAX_BENCH_STEPS} steps");
    }
    let mask = match init.as_ref().map(|c| c.mask_token_id).or(a.mask_token_id) {
        Some(m) if (m as usize) < tc.vocab_size => m,
        Some(m) => bail!("--mask-token-id {m} is outside the vocabulary"),
        None => unused_token(lm, samples),
    };
    let mut layers = tc.clone();
    layers.arch = Arch::Qwen3;
    layers.n_layers = draft_layers;
    layers.rope_scaling = paradraft::model::config::RopeScaling::None;
    layers.rope_style = paradraft::runtime::ops::RopeStyle::Half;
    let config = DflashConfig {
        layers,
        block_size,
        num_target_layers: tc.n_layers,
        mask_token_id: mask,
        target_layer_ids: taps.clone(),
        draft_vocab_size: None,
    };
    eprintln!(
        "mask token {mask} ({:?}), target layers {taps:?}",
        lm.tokenizer
            .decode(&[paradraft::TokenId(mask)])
            .unwrap_or_default()
    );

    let feats = feature_cache(&a.d, &prep, &stored, taps.len() * tc.hidden_size)?;
    if a.d.until == Some(Stage::Features) {
        return Ok(());
    }
    let data = Data {
        target,
        samples,
        features: &feats,
        train: train_idx.clone(),
        vocab,
        device,
        teacher_from: samples.len(),
    };
    let p = TrainParams {
        block_size,
        anchors: a.anchors,
        batch_seqs: a.batch_seqs,
        epochs: a.epochs,
        max_steps: a.max_steps,
        lr: a.lr,
        gamma: gamma_for(block_size),
        kl_weight: a.kl_weight,
        init_layers: if a.init_from_target {
            (tc.n_layers.saturating_sub(draft_layers)..tc.n_layers).collect()
        } else {
            vec![]
        },
        init_from: a.init_from.clone(),
        seed: a.d.seed,
        ..TrainParams::default()
    };
    if let Some(dir) = &a.evaluate {
        let (net, vocab) = paradraft::train::dflash::load_exported(dir, tc.vocab_size)?;
        if net.config.target_layer_ids != taps {
            bail!(
                "{} taps target layers {:?}, this run's features hold {taps:?} (pass --target-layers)",
                dir.display(),
                net.config.target_layer_ids
            );
        }
        let data = Data {
            vocab: &vocab,
            ..data
        };
        let evals = held_out(&net, &data, eval_idx, &dir.display().to_string())?;
        println!("{}", serde_json::to_string_pretty(&evals)?);
        return Ok(());
    }
    if let Some(steps) = a.bench {
        let r = bench(&config, &data, &p, steps.max(1))?;
        println!(
            "train bench: {} steps, {:.3} s/step, {:.0} positions/step, {:.0} positions/s",
            r.steps, r.secs_per_step, r.positions_per_step, r.positions_per_s
        );
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    std::fs::write(
        a.d.out.join("train_params.json"),
        serde_json::to_string_pretty(
            &serde_json::json!({"params": p, "config": config.to_json()}),
        )?,
    )?;
    let net = train(&config, &data, &p, &a.d.out, print_step)?;
    let log = paradraft::train::plot::read_log(&a.d.out.join("train_log.jsonl"))?;
    paradraft::train::plot::loss_svg(
        &log,
        &format!(
            "DFlash drafter for {}: {} layer(s), block {}",
            target_name(&a.d),
            draft_layers,
            block_size
        ),
        &a.d.out.join("loss.svg"),
    )?;
    let dir = a.export.clone().unwrap_or_else(|| a.d.out.join("drafter"));
    export(&net, vocab, tc.vocab_size, &dir, candle_core::DType::F16)?;
    eprintln!("drafter written to {}", dir.display());
    if a.d.until == Some(Stage::Train) {
        return Ok(());
    }
    let evals = held_out(&net, &data, eval_idx, "drafter")?;
    std::fs::write(
        a.d.out.join("eval.json"),
        serde_json::to_string_pretty(&evals)?,
    )?;
    Ok(())
}

/// Held-out acceptance at the drafter's block size and at block 8, printed as it goes.
fn held_out(
    net: &paradraft::train::dflash::net::Net,
    data: &Data,
    eval_idx: &[usize],
    what: &str,
) -> Result<Vec<paradraft::train::run::Eval>> {
    let b = net.config.block_size;
    let mut evals = vec![];
    for block in [b, 8.min(b)] {
        let e = evaluate(net, data, eval_idx, block, 32)?;
        eprintln!("{what} on held-out: {e}");
        evals.push(e);
    }
    Ok(evals)
}

/// Prints every tenth training step (and the first).
pub fn print_step(l: &paradraft::train::run::LogLine) {
    if l.step.is_multiple_of(10) || l.step == 1 {
        eprintln!(
            "step {} epoch {} loss {:.4} acc1 {:.3} lr {:.2e} |g| {:.2} {:.2}s/step elapsed {:.0}s",
            l.step, l.epoch, l.loss, l.acc1, l.lr, l.grad_norm, l.secs, l.elapsed_s
        );
    }
}

pub fn target_name(a: &DataArgs) -> String {
    a.m.model
        .as_ref()
        .and_then(|p| p.file_name())
        .map_or("SmolLM2-135M-Instruct".into(), |f| {
            f.to_string_lossy().into_owned()
        })
}

/// The paper's loss decay: γ = 7 for B = 16, 5 for 10, 4 for 8 (interpolated elsewhere).
fn gamma_for(block: usize) -> f32 {
    match block {
        16.. => 7.0,
        10..=15 => 5.0,
        _ => 4.0,
    }
}
