//! `paradraft train pard`: token sequences (self-distilled or any text the data stage holds) →
//! COD training of the target's first N layers as a mask-token parallel drafter → held-out
//! evaluation → an exported drafter (compact layout: layers and final norm; the embedding and
//! tied head are the target's). No target features are needed.

use crate::train::{prepare, print_step, target_name, unused_token, DataArgs, Prepared, Stage};
use anyhow::{bail, Result};
use clap::Args;
use paradraft::train::pard::{
    config_for, evaluate, export, load_exported, train, Cod, Data, PardParams,
};
use paradraft::train::run::Schedule;
use paradraft::TokenId;
use std::path::PathBuf;

#[derive(Args)]
pub struct PardArgs {
    #[command(flatten)]
    pub d: DataArgs,
    /// Decoder layers of the drafter: the target's first N, fine-tuned.
    #[arg(long, default_value_t = 4)]
    pub draft_layers: usize,
    /// K: copies in training (the real tokens and K − 1 mask copies; the paper's 8).
    #[arg(long, default_value_t = 8)]
    pub k: usize,
    /// COD retention r (copy i keeps max(r^i, r_min) of the positions; 1 keeps all).
    #[arg(long, default_value_t = 0.7)]
    pub cod_r: f64,
    #[arg(long, default_value_t = 0.2)]
    pub cod_r_min: f64,
    /// Longest training sequence in tokens.
    #[arg(long, default_value_t = 512)]
    pub max_seq: usize,
    /// Mask token id (default: the lowest id absent from the data and not a stop token).
    #[arg(long)]
    pub mask_token_id: Option<u32>,
    /// Sequences per optimiser step.
    #[arg(long, default_value_t = 4)]
    pub batch_seqs: usize,
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Cap on optimiser steps (0: epochs decide).
    #[arg(long, default_value_t = 0)]
    pub max_steps: usize,
    #[arg(long, default_value_t = 3e-4)]
    pub lr: f64,
    /// Steps between checkpoints.
    #[arg(long, default_value_t = 25)]
    pub save_every: usize,
    /// Evaluate this exported PARD drafter on this run's held-out samples and exit.
    #[arg(long)]
    pub evaluate: Option<PathBuf>,
    /// Where the drafter is written (default: OUT/pard-drafter).
    #[arg(long)]
    pub export: Option<PathBuf>,
}

pub fn run(a: PardArgs) -> Result<()> {
    let device = paradraft::train::dflash::device(&a.d.device)?;
    if a.batch_seqs == 0 || a.max_seq < 2 || a.max_seq > 8192 {
        bail!("--batch-seqs must be at least 1 and --max-seq between 2 and 8192");
    }
    if !(2..=64).contains(&a.k) {
        bail!("--k {}: between 2 and 64 (PARD trains with 8)", a.k);
    }
    let cod_ok = a.cod_r > 0.0 && a.cod_r <= 1.0 && (0.0..=1.0).contains(&a.cod_r_min);
    if !(cod_ok && a.lr.is_finite() && a.lr > 0.0) {
        bail!("--cod-r must be in (0, 1], --cod-r-min in [0, 1] and --lr > 0");
    }
    // A target the trainer cannot adapt is refused before any data is made.
    let Some((prep, _)) = prepare(&a.d, |m| {
        config_for(m, a.draft_layers)?;
        Ok(vec![])
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
    let target = &lm.model;
    let config = config_for(target, a.draft_layers)?;
    let mask = match a.mask_token_id {
        Some(m) if (m as usize) < target.config.vocab_size => m,
        Some(m) => bail!("--mask-token-id {m} is outside the vocabulary"),
        None => unused_token(lm, samples),
    };
    eprintln!(
        "mask token {mask} ({:?}), {} of the target's {} layers",
        lm.tokenizer.decode(&[TokenId(mask)]).unwrap_or_default(),
        a.draft_layers,
        target.config.n_layers
    );
    if a.d.until == Some(Stage::Features) {
        return Ok(());
    }
    let data = Data {
        target,
        samples,
        train: train_idx.clone(),
        vocab,
        mask: TokenId(mask),
        device: device.clone(),
    };
    let head = paradraft::train::dflash::frozen_head(target, vocab)?;
    let held = |net: &paradraft::train::pard::net::Net,
                data: &Data,
                what: &str|
     -> Result<paradraft::train::run::Eval> {
        let e = evaluate(net, &head, data, eval_idx, a.k, 32, a.max_seq)?;
        eprintln!("{what} on held-out: {e}");
        Ok(e)
    };
    if let Some(dir) = &a.evaluate {
        let (net, mask, vocab) = load_exported(dir, target)?;
        let head = paradraft::train::dflash::frozen_head(target, &vocab)?;
        let data = Data {
            vocab: &vocab,
            mask,
            ..data
        };
        let e = evaluate(&net, &head, &data, eval_idx, a.k, 32, a.max_seq)?;
        eprintln!("{} on held-out: {e}", dir.display());
        println!("{}", serde_json::to_string_pretty(&e)?);
        return Ok(());
    }
    let p = PardParams {
        cod: Cod {
            k: a.k,
            r: a.cod_r,
            r_min: a.cod_r_min,
        },
        max_seq: a.max_seq,
        schedule: Schedule {
            batch_seqs: a.batch_seqs,
            epochs: a.epochs,
            max_steps: a.max_steps,
            lr: a.lr,
            seed: a.d.seed,
            save_every: a.save_every,
            ..PardParams::default().schedule
        },
    };
    std::fs::write(
        a.d.out.join("pard_params.json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "params": p,
            "draft_layers": a.draft_layers,
            "mask_token_id": mask,
        }))?,
    )?;
    let dir = a.d.out.join("pard");
    std::fs::create_dir_all(&dir)?;
    let net = train(&config, &data, &p, &dir, print_step)?;
    let log = paradraft::train::plot::read_log(&dir.join("train_log.jsonl"))?;
    paradraft::train::plot::loss_svg(
        &log,
        &format!(
            "PARD drafter for {}: {} layers, K = {}",
            target_name(&a.d),
            a.draft_layers,
            a.k
        ),
        &dir.join("loss.svg"),
    )?;
    let out = a
        .export
        .clone()
        .unwrap_or_else(|| a.d.out.join("pard-drafter"));
    export(
        &net,
        TokenId(mask),
        a.k,
        vocab,
        &out,
        candle_core::DType::F16,
    )?;
    eprintln!("drafter written to {}", out.display());
    if a.d.until == Some(Stage::Train) {
        return Ok(());
    }
    let e = held(&net, &data, "drafter")?;
    std::fs::write(dir.join("eval.json"), serde_json::to_string_pretty(&e)?)?;
    Ok(())
}
