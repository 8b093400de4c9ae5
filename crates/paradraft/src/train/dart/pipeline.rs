//! `train dart` as one run: self-distilled data → cached target taps (DART's three layers plus
//! the last) → prefix-shared training → export in the published layout → held-out evaluation
//! (or: evaluate an exported drafter). The data stages are shared with `train dflash`, so one
//! working directory can serve both.

use super::{config_for, evaluate, export, load_exported, stored_taps, train, DartParams, Data};
use crate::error::{Error, Result};
use crate::model::Loaded;
use crate::train::pipeline::{plot_loss, prepare, print_step, write_json, DataSpec, Stage};
use crate::train::run::{Eval, Schedule};
use std::path::{Path, PathBuf};

/// One DART training run's settings (also `paradraft train dart`'s flags).
#[derive(Clone, Debug, clap::Args)]
pub struct DartRun {
    /// Mask slots per drafting call (d − 1; the paper's d = 8).
    #[arg(long, default_value_t = 7)]
    pub draft_length: usize,
    /// Prefixes per sequence given a block of mask slots, resampled every epoch (0: all).
    #[arg(long, default_value_t = 48)]
    pub anchors: usize,
    /// Depth decay γ: the t-th future token weighs γ^(t−1).
    #[arg(long, default_value_t = 0.6)]
    pub gamma: f32,
    /// Weight of the KL term from the target's distribution (0: cross-entropy only).
    #[arg(long, default_value_t = 1.0)]
    pub kl_weight: f64,
    /// Sequences per optimiser step.
    #[arg(long, default_value_t = 4)]
    pub batch_seqs: usize,
    #[arg(long, default_value_t = 2)]
    pub epochs: usize,
    /// Cap on optimiser steps (0: epochs decide).
    #[arg(long, default_value_t = 0)]
    pub max_steps: usize,
    #[arg(long, default_value_t = 6e-4)]
    pub lr: f64,
    /// Steps between checkpoints.
    #[arg(long, default_value_t = 50)]
    pub save_every: usize,
    /// Layers of the drafter (the paper's 1; more are plain LLaMA layers over the first).
    #[arg(long, default_value_t = 1)]
    pub layers: usize,
    /// Grow this exported DART drafter to `--layers` layers, its new layers the identity until
    /// trained, write it to `--export` (default: OUT/dart-drafter) and exit.
    #[arg(long)]
    pub grow: Option<PathBuf>,
    /// Evaluate this exported DART drafter on this run's held-out samples and exit.
    #[arg(long)]
    pub evaluate: Option<PathBuf>,
    /// Where the drafter is written (default: OUT/dart-drafter).
    #[arg(long)]
    pub export: Option<PathBuf>,
}

pub fn run(lm: Loaded, spec: &DataSpec, r: &DartRun) -> Result<()> {
    let device = crate::train::dflash::device(&spec.device)?;
    let bad = |m: &str| Err(Error::BadRequest(m.into()));
    if r.draft_length == 0 || r.batch_seqs == 0 {
        return bad("--draft-length and --batch-seqs must be at least 1");
    }
    if r.draft_length > 64 {
        return Err(Error::BadRequest(format!(
            "--draft-length {}: at most 64 (DART uses 8)",
            r.draft_length
        )));
    }
    if !(1..=crate::drafters::dart::config::MAX_LAYERS).contains(&r.layers) {
        return Err(Error::BadRequest(format!(
            "--layers {}: a DART drafter has 1 to {} layers",
            r.layers,
            crate::drafters::dart::config::MAX_LAYERS
        )));
    }
    let out = r
        .export
        .clone()
        .unwrap_or_else(|| spec.out.join("dart-drafter"));
    if let Some(dir) = &r.grow {
        return grow(&lm, dir, r.layers, spec.seed, &out);
    }
    if !(r.gamma > 0.0 && r.gamma <= 1.0) || r.kl_weight < 0.0 || r.lr <= 0.0 {
        return bad("--gamma must be in (0, 1], --kl-weight ≥ 0 and --lr > 0");
    }
    let stored = stored_taps(&lm.model)?;
    let Some(prep) = prepare(lm, spec, stored)? else {
        return Ok(());
    };
    let target = &prep.lm.model;
    eprintln!("DART taps (target layer outputs) {:?}", &prep.stored[..3]);
    let feats = prep.feature_cache(&spec.out, 3 * target.config.hidden_size)?;
    if spec.stops_after(Stage::Features) {
        return Ok(());
    }
    let data = prep.data(&feats, device);
    let held = |net: &super::net::Net, data: &Data, what: &str| -> Result<Eval> {
        let e = evaluate(net, data, &prep.eval_idx, 32)?;
        eprintln!("{what} on held-out: {e}");
        Ok(e)
    };
    if let Some(dir) = &r.evaluate {
        let (net, vocab) = load_exported(dir)?;
        let data = Data {
            vocab: &vocab,
            ..data
        };
        let e = held(&net, &data, &dir.display().to_string())?;
        println!("{}", serde_json::to_string_pretty(&e).unwrap_or_default());
        return Ok(());
    }
    let mut config = config_for(target, r.draft_length, prep.vocab.len());
    config.layer.n_layers = r.layers;
    let p = DartParams {
        anchors: r.anchors,
        gamma: r.gamma,
        kl_weight: r.kl_weight,
        schedule: Schedule {
            batch_seqs: r.batch_seqs,
            epochs: r.epochs,
            max_steps: r.max_steps,
            lr: r.lr,
            seed: spec.seed,
            save_every: r.save_every,
            ..DartParams::default().schedule
        },
    };
    write_json(
        &spec.out.join("dart_params.json"),
        &serde_json::json!({"params": p, "config": config.to_json()}),
    )?;
    let dir = spec.out.join("dart");
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let net = train(&config, &data, &p, &dir, print_step)?;
    plot_loss(
        &dir,
        &format!(
            "DART drafter for {}: d = {}",
            spec.target_name,
            r.draft_length + 1
        ),
    )?;
    export(&net, &prep.vocab, &out, candle_core::DType::F16)?;
    eprintln!("drafter written to {}", out.display());
    if spec.stops_after(Stage::Train) {
        return Ok(());
    }
    let e = held(&net, &data, "drafter")?;
    write_json(&dir.join("eval.json"), &e)
}

/// `--grow`: the exported drafter in `dir` with `layers` layers in all, written to `out`.
fn grow(lm: &Loaded, dir: &Path, layers: usize, seed: u64, out: &Path) -> Result<()> {
    let (net, vocab) = load_exported(dir)?;
    net.config.check_target(&lm.model.config)?;
    let have = net.config.layer.n_layers;
    if layers <= have {
        return Err(Error::BadRequest(format!(
            "--grow {}: it has {have} layers already; --layers must be more",
            dir.display()
        )));
    }
    let net = net.grow(layers, seed).map_err(crate::train::run::cerr)?;
    export(&net, &vocab, out, candle_core::DType::F16)?;
    eprintln!(
        "{} grown from {have} to {layers} layers: {}",
        dir.display(),
        out.display()
    );
    Ok(())
}
