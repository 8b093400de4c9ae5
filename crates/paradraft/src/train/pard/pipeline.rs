//! The mask-token trainers as one run: token sequences (self-distilled, or any text the data
//! stage holds) → the target's first N layers trained as a parallel drafter with an objective
//! (PARD's COD, DiffuSpec's masked diffusion) → export in the compact layout → held-out
//! evaluation (or: evaluate an exported drafter). No target features are needed.

use super::net::Net;
use super::{config_for, evaluate, export, load_exported, train, Data, Objective};
use crate::error::{Error, Result};
use crate::model::Loaded;
use crate::train::pipeline::{plot_loss, prepare, print_step, write_json, DataSpec, Stage};
use crate::train::run::{cerr, Schedule};
use crate::types::TokenId;
use std::path::PathBuf;

/// One mask-token training run's settings (also the flags `paradraft train pard` and `train dlm`
/// share).
#[derive(Clone, Debug, clap::Args)]
pub struct MaskRun {
    /// The objective's name: the working subdirectory, the files, the plot (set by the caller).
    #[arg(skip)]
    pub name: String,
    /// Drafts per pass the evaluation runs at (set by the caller from the objective).
    #[arg(skip)]
    pub k: usize,
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

/// Trains with `obj` (its settings `params`, as recorded) and exports.
pub fn run(
    lm: Loaded,
    spec: &DataSpec,
    r: &MaskRun,
    obj: &dyn Objective,
    params: &serde_json::Value,
) -> Result<()> {
    let device = crate::train::dflash::device(&spec.device)?;
    let bad = |m: String| Error::BadRequest(m);
    if r.batch_seqs == 0 || r.max_seq < 2 || r.max_seq > 8192 {
        return Err(bad(
            "--batch-seqs must be at least 1 and --max-seq between 2 and 8192".into(),
        ));
    }
    obj.check()?;
    if !(r.lr.is_finite() && r.lr > 0.0) {
        return Err(bad("--lr must be > 0".into()));
    }
    // A target the trainer cannot adapt is refused before any data is made.
    let config = config_for(&lm.model, r.draft_layers)?;
    let Some(prep) = prepare(lm, spec, vec![])? else {
        return Ok(());
    };
    let target = &prep.lm.model;
    let init = match &r.init {
        Some(dir) => {
            let (net, m, v) = load_exported(dir, target)?;
            if v.d2t != prep.vocab.d2t {
                return Err(bad(format!("--init {}: its draft vocabulary differs from this run's (same --draft-vocab and samples needed)", dir.display())));
            }
            Some((net, m.0))
        }
        None => None,
    };
    let mask = prep
        .mask_token(r.mask_token_id, init.as_ref().map(|i| i.1))
        .map_err(|e| e.context("--init"))?;
    eprintln!(
        "mask token {mask} ({:?}), {} of the target's {} layers",
        prep.lm
            .tokenizer
            .decode(&[TokenId(mask)])
            .unwrap_or_default(),
        r.draft_layers,
        target.config.n_layers
    );
    if spec.stops_after(Stage::Features) {
        return Ok(());
    }
    let data = Data {
        target,
        samples: &prep.samples,
        train: prep.train_idx.clone(),
        vocab: &prep.vocab,
        mask: TokenId(mask),
        device: device.clone(),
        max_seq: r.max_seq,
    };
    let eval_idx = &prep.eval_idx;
    if let Some(dir) = &r.evaluate {
        let (net, mask, vocab) = load_exported(dir, target)?;
        let head = crate::train::dflash::frozen_head(target, &vocab).map_err(cerr)?;
        let data = Data {
            vocab: &vocab,
            mask,
            ..data
        };
        let e = evaluate(&net, &head, &data, obj, eval_idx, r.k, 32)?;
        eprintln!("{} on held-out: {e}", dir.display());
        println!("{}", serde_json::to_string_pretty(&e).unwrap_or_default());
        return Ok(());
    }
    let schedule = Schedule {
        batch_seqs: r.batch_seqs,
        epochs: r.epochs,
        max_steps: r.max_steps,
        lr: r.lr,
        seed: spec.seed,
        save_every: r.save_every,
        ..super::default_schedule()
    };
    let name = &r.name;
    write_json(
        &spec.out.join(format!("{name}_params.json")),
        &serde_json::json!({
            "objective": params,
            "max_seq": r.max_seq,
            "schedule": schedule,
            "draft_layers": r.draft_layers,
            "mask_token_id": mask,
            "init": r.init,
        }),
    )?;
    let dir = spec.out.join(name);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let net: Net = train(
        &config,
        &data,
        obj,
        &schedule,
        init.map(|(n, _)| n),
        &dir,
        print_step,
    )?;
    plot_loss(
        &dir,
        &format!(
            "{} drafter for {}: {} layers, k = {}",
            name.to_uppercase(),
            spec.target_name,
            r.draft_layers,
            r.k
        ),
    )?;
    let out = r
        .export
        .clone()
        .unwrap_or_else(|| spec.out.join(format!("{name}-drafter")));
    export(
        &net,
        TokenId(mask),
        obj,
        &prep.vocab,
        &out,
        candle_core::DType::F16,
    )?;
    eprintln!("drafter written to {}", out.display());
    if spec.stops_after(Stage::Train) {
        return Ok(());
    }
    let head = crate::train::dflash::frozen_head(target, &prep.vocab).map_err(cerr)?;
    let e = evaluate(&net, &head, &data, obj, eval_idx, r.k, 32)?;
    eprintln!("drafter on held-out: {e}");
    write_json(&dir.join("eval.json"), &e)
}
