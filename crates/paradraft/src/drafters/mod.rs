//! Drafters, one module per method. Baseline: prompt lookup ([`pld`]); the tests' replayed
//! trees live with the tests (`tests/common/replay.rs`).

pub mod dart;
pub mod dflash;
pub mod diffuspec;
pub mod draft_model;
pub mod mask_lm;
pub mod pard;
pub mod parts;
pub mod pld;
pub mod registry;
pub mod speculative_config;
pub mod vocab;

use crate::error::Result;
use crate::sample::SamplingParams;
use crate::speculative::{DraftTree, Drafter, Hidden, Outcome};
use crate::types::TokenId;
use registry::{LoadArgs, LoadedMethod, MethodEntry, Mode, Template};

/// Proposes nothing: the speculative loop then decodes one token per target pass, which makes
/// it the AR baseline with exactly the speculative methods' overheads.
pub struct NoDraft;

impl Drafter for NoDraft {
    fn name(&self) -> &str {
        "none"
    }
    fn begin(&mut self, _: &[TokenId], _: Hidden) -> Result<()> {
        Ok(())
    }
    fn propose(&mut self, _: &[TokenId], _: usize) -> Result<DraftTree> {
        Ok(DraftTree::new())
    }
    fn observe(&mut self, _: &Outcome, _: Hidden) -> Result<()> {
        Ok(())
    }
}

impl<'t> Template<'t> for NoDraft {
    fn fork(&self, _: usize, _: SamplingParams) -> Result<Box<dyn Drafter + 't>> {
        Ok(Box::new(NoDraft))
    }
}

/// Plain AR decoding, in the registry as the method `none`.
pub static NONE: MethodEntry = MethodEntry {
    name: "none",
    about: "no drafter: plain AR decoding",
    modes: &[Mode::Greedy],
    options: &[],
    default_dir: None,
    load: load_none,
    label: None,
};

fn load_none<'t>(_: &LoadArgs<'_, 't>) -> Result<LoadedMethod<'t>> {
    Ok(LoadedMethod {
        template: Box::new(NoDraft),
        max_draft: 0,
    })
}
