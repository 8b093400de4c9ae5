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
pub mod speculative_config;
pub mod vocab;

use crate::error::Result;
use crate::speculative::{DraftTree, Drafter, Hidden, Outcome};
use crate::types::TokenId;

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
