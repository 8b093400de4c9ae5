//! `paradraft train …` (dflash, dart, pard, dlm; the campaign in `train_campaign.rs`): the
//! training commands' flags, mapped onto the library's pipeline
//! (`paradraft::train::pipeline` and each objective's `pipeline::run`). `train dflash`:
//! self-distillation data → cached target features → training → held-out evaluation → an
//! exported drafter; every stage resumes from what `--out` holds.

use crate::ModelArgs;
use anyhow::Result;
use clap::{Args, Subcommand};
use paradraft::train::dart::pipeline::DartRun;
use paradraft::train::dflash::pipeline::DflashRun;
use paradraft::train::dlm::Diffusion;
use paradraft::train::pard::pipeline::MaskRun;
use paradraft::train::pard::{Cod, Objective};
use paradraft::train::pipeline::{keep_freed_memory, DataSpec};

#[derive(Subcommand)]
pub enum TrainCmd {
    /// Train a DFlash block-diffusion drafter for the target (DFlash paper §4).
    Dflash(DflashArgs),
    /// Train a DART parallel drafter (one layer, or more with --layers) for the target (DART paper §3.4, App. B).
    Dart(DartArgs),
    /// Train a PARD mask-token parallel draft model from the target's first layers (PARD
    /// paper §3.2: conditional drop-token training; no target features).
    Pard(PardArgs),
    /// Train a DiffuSpec diffusion-LM drafter from the target's first layers (DiffuSpec §4.1:
    /// masked diffusion, eq. 3; Dream's shifted logits; block-bidirectional attention).
    Dlm(DlmArgs),
    /// Start or resume a drafter's training campaign (DART or DFlash) that accrues across
    /// sessions: online teacher forcing on self-distilled samples (and corpus text for DART),
    /// checkpoints under $HOME/.cache/paradraft/campaign, a held-out curve (safe to kill at any
    /// moment).
    Campaign(crate::train_campaign::CampaignArgs),
}

/// What every drafter trainer shares: the target's flags and the library's data spec (the
/// working directory, self-distillation, the held-out split, the draft vocabulary).
#[derive(Args)]
pub struct DataArgs {
    #[command(flatten)]
    pub m: ModelArgs,
    #[command(flatten)]
    pub spec: DataSpec,
}

#[derive(Args)]
pub struct DflashArgs {
    #[command(flatten)]
    pub d: DataArgs,
    #[command(flatten)]
    pub r: DflashRun,
}

impl DataArgs {
    /// The library's data spec, and the target loaded.
    pub fn load(&self) -> Result<(paradraft::model::Loaded, DataSpec)> {
        let (lm, _) = self.m.load()?;
        let mut spec = self.spec.clone();
        spec.target_name = self
            .m
            .model
            .as_ref()
            .and_then(|p| p.file_name())
            .map_or("SmolLM2-135M-Instruct".into(), |f| {
                f.to_string_lossy().into_owned()
            });
        Ok((lm, spec))
    }
}

pub fn run(cmd: TrainCmd) -> Result<()> {
    keep_freed_memory();
    match cmd {
        TrainCmd::Dflash(a) => dflash(a),
        TrainCmd::Dart(a) => dart(a),
        TrainCmd::Pard(a) => run_pard(a),
        TrainCmd::Dlm(a) => run_dlm(a),
        TrainCmd::Campaign(a) => crate::train_campaign::run(a),
    }
}

fn dflash(a: DflashArgs) -> Result<()> {
    // A device that is not there is refused before the target loads.
    paradraft::train::dflash::device(&a.d.spec.device)?;
    let (lm, spec) = a.d.load()?;
    Ok(paradraft::train::dflash::pipeline::run(lm, &spec, &a.r)?)
}

#[derive(Args)]
pub struct DartArgs {
    #[command(flatten)]
    pub d: DataArgs,
    #[command(flatten)]
    pub r: DartRun,
}

fn dart(a: DartArgs) -> Result<()> {
    paradraft::train::dflash::device(&a.d.spec.device)?;
    let (lm, spec) = a.d.load()?;
    Ok(paradraft::train::dart::pipeline::run(lm, &spec, &a.r)?)
}

#[derive(Args)]
pub struct PardArgs {
    #[command(flatten)]
    pub d: DataArgs,
    #[command(flatten)]
    pub r: MaskRun,
    #[command(flatten)]
    pub cod: Cod,
}

#[derive(Args)]
pub struct DlmArgs {
    #[command(flatten)]
    pub d: DataArgs,
    #[command(flatten)]
    pub r: MaskRun,
    #[command(flatten)]
    pub diffusion: Diffusion,
}

fn run_pard(a: PardArgs) -> Result<()> {
    run_mask(
        a.d,
        a.r,
        &a.cod,
        a.cod.k,
        "pard",
        serde_json::to_value(a.cod)?,
    )
}

fn run_dlm(a: DlmArgs) -> Result<()> {
    let d = a.diffusion;
    run_mask(a.d, a.r, &d, d.k, "dlm", serde_json::to_value(d)?)
}

/// Trains with `obj` (named `name`; evaluated at `k` drafts per pass) and exports.
fn run_mask(
    d: DataArgs,
    mut r: MaskRun,
    obj: &dyn Objective,
    k: usize,
    name: &str,
    params: serde_json::Value,
) -> Result<()> {
    paradraft::train::dflash::device(&d.spec.device)?;
    let (lm, spec) = d.load()?;
    (r.name, r.k) = (name.into(), k);
    Ok(paradraft::train::pard::pipeline::run(
        lm, &spec, &r, obj, &params,
    )?)
}
