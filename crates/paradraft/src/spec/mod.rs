//! The speculative-decoding core shared by every drafter (spec §1, §8): draft trees and their
//! linearisation, verification rules, the decode loop and its telemetry.

pub mod decode;
pub mod sizing;
pub mod tree;
pub mod verify;

pub use decode::{speculative_generate, RoundStats, SpecGeneration, Speculation};
pub use tree::{DraftTree, Linearised, NodeId};
pub use verify::{Outcome, Rule};

use crate::error::Result;
use crate::types::TokenId;

/// A drafter's lifecycle: `begin` once per request, then per round `propose` a tree that
/// continues the committed tokens and `observe` what the target accepted.
pub trait Drafter {
    /// A short name for reports.
    fn name(&self) -> &str;

    /// A new request starts with these prompt tokens.
    fn begin(&mut self, prompt: &[TokenId]) -> Result<()>;

    /// Proposes tokens to follow `committed` (prompt and output so far; its last token is the
    /// root of the tree, not yet verified by a target forward). An empty tree means plain
    /// autoregressive decoding this round.
    fn propose(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<DraftTree>;

    /// The target accepted `outcome` for the last proposal.
    fn observe(&mut self, outcome: &Outcome) -> Result<()>;
}
