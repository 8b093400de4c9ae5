//! `paradraft train dart`: the flags of the library's `DartRun`, mapped onto
//! `paradraft::train::dart::pipeline::run` (data → taps → training → export → held-out
//! evaluation; every stage resumes from what `--out` holds, shared with `train dflash`).

use crate::train::DataArgs;
use anyhow::Result;
use clap::Args;
use paradraft::train::dart::pipeline::DartRun;

#[derive(Args)]
pub struct DartArgs {
    #[command(flatten)]
    pub d: DataArgs,
    #[command(flatten)]
    pub r: DartRun,
}

pub fn run(a: DartArgs) -> Result<()> {
    paradraft::train::dflash::device(&a.d.spec.device)?;
    let (lm, spec) = a.d.load()?;
    Ok(paradraft::train::dart::pipeline::run(lm, &spec, &a.r)?)
}
