//! The speculative-decoding core shared by every drafter (docs/architecture.md): draft trees and their
//! linearisation, verification rules, the decode loop and its telemetry.

pub mod cps;
pub mod decode;
pub mod forced;
pub mod sizing;
pub mod step;
mod summary;
pub use crate::draft as tree;
pub mod tree_search;
pub mod verify;

pub use decode::{RoundOutput, RowNeeds, Session, Speculation};
pub use step::speculative_generate;
pub use summary::{RoundStats, SpecGeneration};
pub use tree::{DraftTree, Linearised, NodeId};
pub use verify::{Candidates, Outcome, VerifyRule};

use crate::error::Result;
use crate::types::TokenId;

/// Target hidden states for newly committed positions: for each position, the outputs of the
/// layers the drafter asked for ([`Drafter::taps`]), concatenated in that order. Empty when it
/// asked for none.
#[derive(Clone, Copy, Debug)]
pub struct Hidden<'a> {
    /// Floats per position (taps × hidden size).
    pub width: usize,
    /// `positions × width`.
    pub rows: &'a [f32],
}

/// A bound on the positions one round commits, as drafters that hold target states count
/// them: the accepted path is no deeper than a DART drafter's trained depth, a DFlash block or
/// `auto`'s deepest lookup (24), plus the bonus token.
pub const ROUND_POSITIONS: usize = 64;

/// The forward a round is verified in, as the session's sizing prices it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchPrice {
    /// Decoding sessions sharing it, this one included (1: alone).
    pub streams: usize,
    /// Its expected ms with one row per session (an AR step of this batch; 0: unknown).
    pub step_ms: f64,
    /// What one more verified row adds to it, ms (0: unknown).
    pub row_ms: f64,
}

impl Default for BatchPrice {
    fn default() -> Self {
        BatchPrice {
            streams: 1,
            step_ms: 0.0,
            row_ms: 0.0,
        }
    }
}

/// A network pass the drafters of several sessions share (batched drafting): each queues its
/// input in [`Drafter::prepare`], the step runs the pass once for all of them, then asks each
/// for its proposal.
pub trait PassQueue {
    /// Runs every queued input in one pass (nothing when none waits). `target` is the model
    /// the step verifies with (the one the drafters were bound to). A failure is each queued
    /// proposal's to report, not the step's.
    fn run(&self, target: &crate::model::Model);
}

/// A handle on a [`PassQueue`]; the drafters of one method share one.
#[derive(Clone)]
pub struct SharedPass(pub std::sync::Arc<dyn PassQueue>);

impl SharedPass {
    /// Whether both handles are on one queue.
    pub fn same(&self, other: &SharedPass) -> bool {
        std::ptr::addr_eq(
            std::sync::Arc::as_ptr(&self.0),
            std::sync::Arc::as_ptr(&other.0),
        )
    }

    pub fn run(&self, target: &crate::model::Model) {
        self.0.run(target)
    }
}

/// A drafter's lifecycle: `begin` once per request, then per round `propose` a tree that
/// continues the committed tokens and `observe` what the target accepted.
pub trait Drafter {
    /// A short name for reports.
    fn name(&self) -> &str;

    /// Target decoder layers (0-based, their outputs) whose states the drafter needs.
    fn taps(&self) -> &[usize] {
        &[]
    }

    /// A new request starts with these prompt tokens; `hidden` holds the prompt's positions.
    fn begin(&mut self, prompt: &[TokenId], hidden: Hidden) -> Result<()>;

    /// Proposes tokens to follow `committed` (prompt and output so far; its last token is the
    /// root of the tree, not yet verified by a target forward). An empty tree means plain
    /// autoregressive decoding this round.
    fn propose(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<DraftTree>;

    /// Batched drafting, a step's first phase: [`Drafter::propose`] follows with the same
    /// arguments once the step has run the passes its sessions' drafters returned here. A
    /// drafter whose proposal runs a network the other sessions' drafters share queues its
    /// input there and returns the pass; its proposal reads the pass's output (running the
    /// pass itself if the caller did not). Default: nothing shared, all work in `propose`.
    fn prepare(&mut self, _committed: &[TokenId], _max_nodes: usize) -> Result<Option<SharedPass>> {
        Ok(None)
    }

    /// Milliseconds of the last proposal spent in its share of a batched pass, outside
    /// [`Drafter::propose`]'s own time.
    fn shared_ms(&self) -> f64 {
        0.0
    }

    /// The next round's target forward, as sizing prices it ([`BatchPrice`]). Called before
    /// each [`Drafter::propose`]; a drafter whose proposals cost time prices them by this,
    /// since a millisecond it spends, or a row it adds, delays every stream of the batch.
    /// Default: ignored.
    fn batch(&mut self, _price: BatchPrice) {}

    /// The target accepted `outcome` for the last proposal. `hidden` holds the positions this
    /// round committed to the KV cache: the root, then each accepted node (the bonus token is
    /// the next root, so its states come with the next round).
    fn observe(&mut self, outcome: &Outcome, hidden: Hidden) -> Result<()>;

    /// The drafter's estimate that the target accepts each node of its last proposal (the
    /// product of its probabilities along the node's path), when its nodes come in score order
    /// so that any prefix is a tree: a sizing policy then cuts the tree to what pays on this
    /// machine ([`sizing::Sizer::cut`]). `None`: size before drafting only.
    fn node_confidence(&self) -> Option<&[f32]> {
        None
    }

    /// Milliseconds the last proposal spent choosing its draft from the drafter's
    /// distributions (DiffuSpec's path search, a tree search) rather than in its network:
    /// telemetry for reports.
    fn selection_ms(&self) -> f64 {
        0.0
    }

    /// How many of the target's best candidates per verified row the drafter wants to see in
    /// [`Outcome::top`] (Token Recycling drafts from them); 0, the default: none.
    fn candidates(&self) -> usize {
        0
    }
}

/// A drafter kept by the caller, lent to a session.
impl<D: Drafter + ?Sized> Drafter for &mut D {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn taps(&self) -> &[usize] {
        (**self).taps()
    }
    fn begin(&mut self, prompt: &[TokenId], hidden: Hidden) -> Result<()> {
        (**self).begin(prompt, hidden)
    }
    fn propose(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<DraftTree> {
        (**self).propose(committed, max_nodes)
    }
    fn prepare(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<Option<SharedPass>> {
        (**self).prepare(committed, max_nodes)
    }
    fn shared_ms(&self) -> f64 {
        (**self).shared_ms()
    }
    fn batch(&mut self, price: BatchPrice) {
        (**self).batch(price)
    }
    fn observe(&mut self, outcome: &Outcome, hidden: Hidden) -> Result<()> {
        (**self).observe(outcome, hidden)
    }
    fn node_confidence(&self) -> Option<&[f32]> {
        (**self).node_confidence()
    }
    fn selection_ms(&self) -> f64 {
        (**self).selection_ms()
    }
    fn candidates(&self) -> usize {
        (**self).candidates()
    }
}
