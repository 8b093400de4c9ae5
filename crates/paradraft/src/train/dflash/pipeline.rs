//! `train dflash` as one run: self-distilled data → cached target features (the drafter's taps
//! plus the target's last layer) → training → export → held-out evaluation at the drafter's
//! block and at block 8 (or: evaluate an exported drafter, or time the training step).

use super::{bench, evaluate, export, load_exported, train, Data};
use super::{DflashConfig, TrainParams};
use crate::drafters::dflash::default_target_layers;
use crate::error::{Error, Result};
use crate::model::{Arch, Loaded};
use crate::train::pipeline::{plot_loss, prepare, print_step, write_json, DataSpec, Stage};
use crate::train::run::Eval;
use std::path::PathBuf;

/// The largest DFlash block a run accepts.
const MAX_BLOCK: usize = 128;
/// The most steps a bench times.
const MAX_BENCH_STEPS: usize = 10_000;

/// One DFlash training run's settings (also `paradraft train dflash`'s flags).
#[derive(Clone, Debug, clap::Args)]
pub struct DflashRun {
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

/// The paper's loss decay: γ = 7 for B = 16, 5 for 10, 4 for 8 (interpolated elsewhere).
fn gamma_for(block: usize) -> f32 {
    match block {
        16.. => 7.0,
        10..=15 => 5.0,
        _ => 4.0,
    }
}

/// The drafter's taps plus the target's last layer (the distillation loss's input).
fn stored_taps(taps: &[usize], n_layers: usize) -> Vec<usize> {
    let mut t = taps.to_vec();
    t.push(n_layers - 1);
    t
}

fn bad(m: String) -> Error {
    Error::BadRequest(m)
}

/// Runs `r` on `lm` with the data of `spec`; what it measured goes to stdout as JSON for
/// `evaluate` and `bench` runs.
pub fn run(lm: Loaded, spec: &DataSpec, r: &DflashRun) -> Result<()> {
    // A device that is not there is refused before anything is written.
    let device = super::device(&spec.device)?;
    if r.init_from.is_some() && r.init_from_target {
        return Err(bad(
            "--init-from and --init-from-target exclude each other".into()
        ));
    }
    // A drafter to fine-tune fixes the shape of the run.
    let init = match &r.init_from {
        Some(dir) => Some(DflashConfig::load(dir)?),
        None => None,
    };
    let tc = lm.model.config.clone();
    let taps = match (&init, &r.target_layers) {
        (Some(c), _) => c.target_layer_ids.clone(),
        (None, Some(t)) => t.clone(),
        (None, None) => default_target_layers(tc.n_layers, r.num_features),
    };
    let (draft_layers, block_size) = match &init {
        Some(c) => (c.layers.n_layers, c.block_size),
        None => (r.draft_layers, r.block_size),
    };
    if block_size < 2 || draft_layers == 0 || r.anchors == 0 || r.batch_seqs == 0 {
        return Err(bad(
            "--block-size ≥ 2, --draft-layers, --anchors and --batch-seqs ≥ 1 are required".into(),
        ));
    }
    if block_size > MAX_BLOCK {
        return Err(bad(format!(
            "--block-size {block_size}: at most {MAX_BLOCK} (DFlash uses 16)"
        )));
    }
    if draft_layers > tc.n_layers {
        return Err(bad(format!(
            "--draft-layers {draft_layers}: a drafter deeper than its target ({} layers) cannot pay",
            tc.n_layers
        )));
    }
    if r.bench.is_some_and(|s| s > MAX_BENCH_STEPS) {
        return Err(bad(format!("--bench: at most {MAX_BENCH_STEPS} steps")));
    }
    if let Some(&t) = taps.iter().find(|&&t| t >= tc.n_layers) {
        return Err(bad(format!(
            "target layer {t} does not exist ({} layers)",
            tc.n_layers
        )));
    }
    // The cache also keeps the target's last layer: the distillation loss scores it with the
    // target's head to get the target's distribution at every position.
    let Some(prep) = prepare(lm, spec, stored_taps(&taps, tc.n_layers))? else {
        return Ok(());
    };
    // A fine-tuned drafter keeps its mask token.
    let init_mask = init.as_ref().map(|c| c.mask_token_id);
    let mask = prep.mask_token(init_mask.or(r.mask_token_id), None)?;
    let mut layers = tc.clone();
    layers.arch = Arch::Qwen3;
    layers.n_layers = draft_layers;
    layers.rope_scaling = crate::model::config::RopeScaling::None;
    layers.rope_style = crate::runtime::ops::RopeStyle::Half;
    // Dense layers, whatever the target's MLP (a mixture of experts: one expert's width).
    layers.extras.moe = None;
    let config = DflashConfig {
        layers,
        block_size,
        num_target_layers: tc.n_layers,
        mask_token_id: mask,
        target_layer_ids: taps.clone(),
        draft_vocab_size: None,
    };
    let lm = &prep.lm;
    eprintln!(
        "mask token {mask} ({:?}), target layers {taps:?}",
        lm.tokenizer
            .decode(&[crate::TokenId(mask)])
            .unwrap_or_default()
    );
    let feats = prep.feature_cache(&spec.out, taps.len() * tc.hidden_size)?;
    if spec.stops_after(Stage::Features) {
        return Ok(());
    }
    let data = prep.data(&feats, device);
    let p = TrainParams {
        block_size,
        anchors: r.anchors,
        batch_seqs: r.batch_seqs,
        epochs: r.epochs,
        max_steps: r.max_steps,
        lr: r.lr,
        gamma: gamma_for(block_size),
        kl_weight: r.kl_weight,
        init_layers: if r.init_from_target {
            (tc.n_layers.saturating_sub(draft_layers)..tc.n_layers).collect()
        } else {
            vec![]
        },
        init_from: r.init_from.clone(),
        seed: spec.seed,
        ..TrainParams::default()
    };
    let eval_idx = &prep.eval_idx;
    if let Some(dir) = &r.evaluate {
        let (net, vocab) = load_exported(dir, tc.vocab_size)?;
        if net.config.target_layer_ids != taps {
            return Err(bad(format!(
                "{} taps target layers {:?}, this run's features hold {taps:?} (pass --target-layers)",
                dir.display(),
                net.config.target_layer_ids
            )));
        }
        let data = Data {
            vocab: &vocab,
            ..data
        };
        let evals = held_out(&net, &data, eval_idx, &dir.display().to_string())?;
        println!("{}", to_json(&evals));
        return Ok(());
    }
    if let Some(steps) = r.bench {
        let b = bench(&config, &data, &p, steps.max(1))?;
        println!(
            "train bench: {} steps, {:.3} s/step, {:.0} positions/step, {:.0} positions/s",
            b.steps, b.secs_per_step, b.positions_per_step, b.positions_per_s
        );
        println!("{}", to_json(&b));
        return Ok(());
    }
    write_json(
        &spec.out.join("train_params.json"),
        &serde_json::json!({"params": p, "config": config.to_json()}),
    )?;
    let net = train(&config, &data, &p, &spec.out, print_step)?;
    plot_loss(
        &spec.out,
        &format!(
            "DFlash drafter for {}: {draft_layers} layer(s), block {block_size}",
            spec.target_name
        ),
    )?;
    let dir = r.export.clone().unwrap_or_else(|| spec.out.join("drafter"));
    export(
        &net,
        &prep.vocab,
        tc.vocab_size,
        &dir,
        candle_core::DType::F16,
    )?;
    eprintln!("drafter written to {}", dir.display());
    if spec.stops_after(Stage::Train) {
        return Ok(());
    }
    let evals = held_out(&net, &data, eval_idx, "drafter")?;
    write_json(&spec.out.join("eval.json"), &evals)
}

fn to_json(v: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// Held-out acceptance at the drafter's block size and at block 8, printed as it goes.
fn held_out(
    net: &super::net::Net,
    data: &Data,
    eval_idx: &[usize],
    what: &str,
) -> Result<Vec<Eval>> {
    let b = net.config.block_size;
    let mut evals = vec![];
    for block in [b, 8.min(b)] {
        let e = evaluate(net, data, eval_idx, block, 32)?;
        eprintln!("{what} on held-out: {e}");
        evals.push(e);
    }
    Ok(evals)
}
