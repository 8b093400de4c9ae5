//! The mask-token drafter trainers: token sequences (self-distilled or any text the data stage
//! holds) → the target's first N layers trained as a parallel drafter → held-out evaluation →
//! an exported drafter (compact layout: layers and final norm; the embedding and tied head are
//! the target's). No target features are needed.
//!
//! - `paradraft train pard`: PARD's conditional drop-token (COD) objective.
//! - `paradraft train dlm`: DiffuSpec's masked-diffusion objective (eq. 3) with Dream's shifted
//!   logits and block-bidirectional attention.

use crate::train::{prepare, print_step, target_name, unused_token, DataArgs, Prepared, Stage};
use anyhow::{bail, Result};
use clap::Args;
use paradraft::train::dlm::Diffusion;
use paradraft::train::pard::net::Net;
use paradraft::train::pard::{
    config_for, evaluate, export, load_exported, train, Cod, Data, Objective,
};
use paradraft::train::run::Schedule;
use paradraft::TokenId;
use std::path::PathBuf;

/// What both mask-token trainers take.
#[derive(Args)]
pub struct MaskArgs {
    #[command(flatten)]
    pub d: DataArgs,
    /// Decoder layers of the drafter: the target's first N, fine-tuned.
    #[arg(long, default_value_t = 4)]
    pub draft_layers: usize,
    /// Longest training sequence in tokens.
    #[arg(long, default_value_t = 512)]
    pub max_seq: usize,
    /// Mask token id (default: the --init drafter's, else the lowest id absent from the data
    /// and not a stop token).
    #[arg(long)]
    pub mask_token_id: Option<u32>,
    /// Start from this exported mask-token drafter (same layer count) instead of the target's
    /// layers.
    #[arg(long)]
    pub init: Option<PathBuf>,
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
    /// Evaluate this exported drafter on this run's held-out samples and exit.
    #[arg(long)]
    pub evaluate: Option<PathBuf>,
    /// Where the drafter is written (default: OUT/<method>-drafter).
    #[arg(long)]
    pub export: Option<PathBuf>,
}

#[derive(Args)]
pub struct PardArgs {
    #[command(flatten)]
    pub m: MaskArgs,
    /// K: copies in training (the real tokens and K − 1 mask copies; the paper's 8).
    #[arg(long, default_value_t = 8)]
    pub k: usize,
    /// COD retention r (copy i keeps max(r^i, r_min) of the positions; 1 keeps all).
    #[arg(long, default_value_t = 0.7)]
    pub cod_r: f64,
    #[arg(long, default_value_t = 0.2)]
    pub cod_r_min: f64,
}

#[derive(Args)]
pub struct DlmArgs {
    #[command(flatten)]
    pub m: MaskArgs,
    /// Block length k: slots denoised per drafting pass.
    #[arg(long, default_value_t = 8)]
    pub k: usize,
    /// Fraction of anchors that get a block in a sequence.
    #[arg(long, default_value_t = 0.3)]
    pub block_frac: f64,
    /// Lowest noise level: η ~ U[eta_min, 1] per block (0: the paper's U[0, 1]).
    #[arg(long, default_value_t = 0.0)]
    pub eta_min: f64,
}

pub fn run_pard(a: PardArgs) -> Result<()> {
    let cod = Cod {
        k: a.k,
        r: a.cod_r,
        r_min: a.cod_r_min,
    };
    run(a.m, &cod, a.k, "pard", &serde_json::to_value(cod)?)
}

pub fn run_dlm(a: DlmArgs) -> Result<()> {
    let d = Diffusion {
        k: a.k,
        block_frac: a.block_frac,
        eta_min: a.eta_min,
    };
    run(a.m, &d, a.k, "dlm", &serde_json::to_value(d)?)
}

/// Trains with `obj` (named `name`; evaluated at `k` drafts per pass) and exports.
fn run(
    a: MaskArgs,
    obj: &dyn Objective,
    k: usize,
    name: &str,
    params: &serde_json::Value,
) -> Result<()> {
    let device = paradraft::train::dflash::device(&a.d.device)?;
    if a.batch_seqs == 0 || a.max_seq < 2 || a.max_seq > 8192 {
        bail!("--batch-seqs must be at least 1 and --max-seq between 2 and 8192");
    }
    obj.check()?;
    if !(a.lr.is_finite() && a.lr > 0.0) {
        bail!("--lr must be > 0");
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
    let init = match &a.init {
        Some(dir) => {
            let (net, m, v) = load_exported(dir, target)?;
            if v.d2t != vocab.d2t {
                bail!("--init {}: its draft vocabulary differs from this run's (same --draft-vocab and samples needed)", dir.display());
            }
            Some((net, m.0))
        }
        None => None,
    };
    let mask = match (a.mask_token_id, &init) {
        (Some(m), _) if (m as usize) >= target.config.vocab_size => {
            bail!("--mask-token-id {m} is outside the vocabulary")
        }
        (Some(m), Some((_, im))) if m != *im => {
            bail!("--mask-token-id {m} differs from the --init drafter's ({im})")
        }
        (Some(m), _) => m,
        (None, Some((_, im))) => *im,
        (None, None) => unused_token(lm, samples),
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
        max_seq: a.max_seq,
    };
    let head = paradraft::train::dflash::frozen_head(target, vocab)?;
    if let Some(dir) = &a.evaluate {
        let (net, mask, vocab) = load_exported(dir, target)?;
        let head = paradraft::train::dflash::frozen_head(target, &vocab)?;
        let data = Data {
            vocab: &vocab,
            mask,
            ..data
        };
        let e = evaluate(&net, &head, &data, obj, eval_idx, k, 32)?;
        eprintln!("{} on held-out: {e}", dir.display());
        println!("{}", serde_json::to_string_pretty(&e)?);
        return Ok(());
    }
    let schedule = Schedule {
        batch_seqs: a.batch_seqs,
        epochs: a.epochs,
        max_steps: a.max_steps,
        lr: a.lr,
        seed: a.d.seed,
        save_every: a.save_every,
        ..paradraft::train::pard::default_schedule()
    };
    std::fs::write(
        a.d.out.join(format!("{name}_params.json")),
        serde_json::to_string_pretty(&serde_json::json!({
            "objective": params,
            "max_seq": a.max_seq,
            "schedule": schedule,
            "draft_layers": a.draft_layers,
            "mask_token_id": mask,
            "init": a.init,
        }))?,
    )?;
    let dir = a.d.out.join(name);
    std::fs::create_dir_all(&dir)?;
    let init = init.map(|(n, _)| n);
    let net: Net = train(&config, &data, obj, &schedule, init, &dir, print_step)?;
    let log = paradraft::train::plot::read_log(&dir.join("train_log.jsonl"))?;
    paradraft::train::plot::loss_svg(
        &log,
        &format!(
            "{} drafter for {}: {} layers, k = {k}",
            name.to_uppercase(),
            target_name(&a.d),
            a.draft_layers,
        ),
        &dir.join("loss.svg"),
    )?;
    let out = a
        .export
        .clone()
        .unwrap_or_else(|| a.d.out.join(format!("{name}-drafter")));
    export(
        &net,
        TokenId(mask),
        obj,
        vocab,
        &out,
        candle_core::DType::F16,
    )?;
    eprintln!("drafter written to {}", out.display());
    if a.d.until == Some(Stage::Train) {
        return Ok(());
    }
    let e = evaluate(&net, &head, &data, obj, eval_idx, k, 32)?;
    eprintln!("drafter on held-out: {e}");
    std::fs::write(dir.join("eval.json"), serde_json::to_string_pretty(&e)?)?;
    Ok(())
}
