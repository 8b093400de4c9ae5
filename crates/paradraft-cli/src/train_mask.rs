//! `paradraft train pard` and `train dlm`: the mask-token trainers' flags (the library's
//! `MaskRun` and objective settings), mapped onto `paradraft::train::pard::pipeline::run`.

use crate::train::DataArgs;
use anyhow::Result;
use clap::Args;
use paradraft::train::dlm::Diffusion;
use paradraft::train::pard::pipeline::MaskRun;
use paradraft::train::pard::{Cod, Objective};

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

pub fn run_pard(a: PardArgs) -> Result<()> {
    run(
        a.d,
        a.r,
        &a.cod,
        a.cod.k,
        "pard",
        serde_json::to_value(a.cod)?,
    )
}

pub fn run_dlm(a: DlmArgs) -> Result<()> {
    let d = a.diffusion;
    run(a.d, a.r, &d, d.k, "dlm", serde_json::to_value(d)?)
}

/// Trains with `obj` (named `name`; evaluated at `k` drafts per pass) and exports.
fn run(
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
