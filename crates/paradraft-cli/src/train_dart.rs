//! `paradraft train dart`: self-distillation data → cached target taps (DART's three layers
//! plus the last) → prefix-shared training → held-out evaluation → an exported drafter in the
//! published layout. Every stage resumes from what `--out` holds (the data stages are shared
//! with `train dflash`, so one `--out` can serve both).

use crate::train::{feature_cache, prepare, print_step, target_name, DataArgs, Prepared, Stage};
use anyhow::{bail, Result};
use clap::Args;
use paradraft::train::dart::{
    config_for, evaluate, export, load_exported, stored_taps, train, DartParams, Data,
};
use paradraft::train::run::Schedule;
use std::path::PathBuf;

#[derive(Args)]
pub struct DartArgs {
    #[command(flatten)]
    pub d: DataArgs,
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
    /// Evaluate this exported DART drafter on this run's held-out samples and exit.
    #[arg(long)]
    pub evaluate: Option<PathBuf>,
    /// Where the drafter is written (default: OUT/dart-drafter).
    #[arg(long)]
    pub export: Option<PathBuf>,
}

pub fn run(a: DartArgs) -> Result<()> {
    let device = paradraft::train::dflash::device(&a.d.device)?;
    if a.draft_length == 0 || a.batch_seqs == 0 {
        bail!("--draft-length and --batch-seqs must be at least 1");
    }
    if a.draft_length > 64 {
        bail!(
            "--draft-length {}: at most 64 (DART uses 8)",
            a.draft_length
        );
    }
    if !(a.gamma > 0.0 && a.gamma <= 1.0) || a.kl_weight < 0.0 || a.lr <= 0.0 {
        bail!("--gamma must be in (0, 1], --kl-weight ≥ 0 and --lr > 0");
    }
    let Some((prep, stored)) = prepare(&a.d, |m| Ok(stored_taps(m)?))? else {
        return Ok(());
    };
    let Prepared {
        lm,
        samples,
        train_idx,
        eval_idx,
        vocab,
    } = &prep;
    let target = &lm.model;
    let h = target.config.hidden_size;
    eprintln!("DART taps (target layer outputs) {:?}", &stored[..3]);
    let feats = feature_cache(&a.d, &prep, &stored, 3 * h)?;
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
    let held = |net: &paradraft::train::dart::net::Net,
                data: &Data,
                what: &str|
     -> Result<paradraft::train::run::Eval> {
        let e = evaluate(net, data, eval_idx, 32)?;
        eprintln!("{what} on held-out: {e}");
        Ok(e)
    };
    if let Some(dir) = &a.evaluate {
        let (net, vocab) = load_exported(dir)?;
        let data = Data {
            vocab: &vocab,
            ..data
        };
        let e = held(&net, &data, &dir.display().to_string())?;
        println!("{}", serde_json::to_string_pretty(&e)?);
        return Ok(());
    }
    let config = config_for(target, a.draft_length, vocab.len());
    let p = DartParams {
        anchors: a.anchors,
        gamma: a.gamma,
        kl_weight: a.kl_weight,
        schedule: Schedule {
            batch_seqs: a.batch_seqs,
            epochs: a.epochs,
            max_steps: a.max_steps,
            lr: a.lr,
            seed: a.d.seed,
            save_every: a.save_every,
            ..DartParams::default().schedule
        },
    };
    std::fs::write(
        a.d.out.join("dart_params.json"),
        serde_json::to_string_pretty(
            &serde_json::json!({"params": p, "config": config.to_json()}),
        )?,
    )?;
    let dir = a.d.out.join("dart");
    std::fs::create_dir_all(&dir)?;
    let net = train(&config, &data, &p, &dir, print_step)?;
    let log = paradraft::train::plot::read_log(&dir.join("train_log.jsonl"))?;
    paradraft::train::plot::loss_svg(
        &log,
        &format!(
            "DART drafter for {}: d = {}",
            target_name(&a.d),
            a.draft_length + 1
        ),
        &dir.join("loss.svg"),
    )?;
    let out = a
        .export
        .clone()
        .unwrap_or_else(|| a.d.out.join("dart-drafter"));
    export(&net, vocab, &out, candle_core::DType::F16)?;
    eprintln!("drafter written to {}", out.display());
    if a.d.until == Some(Stage::Train) {
        return Ok(());
    }
    let e = held(&net, &data, "drafter")?;
    std::fs::write(dir.join("eval.json"), serde_json::to_string_pretty(&e)?)?;
    Ok(())
}
