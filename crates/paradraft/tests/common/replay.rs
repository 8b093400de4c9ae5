//! A drafter that proposes given trees, for tests: random trees, or trees that contain a known
//! continuation (so that drafts get accepted) with random siblings.

use paradraft::speculative::{DraftTree, Drafter, Hidden, NodeId, Outcome};
use paradraft::types::TokenId;
use paradraft::Result;

/// Builds a tree per round from the committed tokens.
pub struct Replay<F: FnMut(&[TokenId], usize) -> DraftTree> {
    pub make: F,
    pub outcomes: Vec<Outcome>,
}

impl<F: FnMut(&[TokenId], usize) -> DraftTree> Replay<F> {
    pub fn new(make: F) -> Self {
        Replay {
            make,
            outcomes: vec![],
        }
    }
}

impl<F: FnMut(&[TokenId], usize) -> DraftTree> Drafter for Replay<F> {
    fn name(&self) -> &str {
        "replay"
    }

    fn begin(&mut self, _prompt: &[TokenId], _hidden: Hidden) -> Result<()> {
        self.outcomes.clear();
        Ok(())
    }

    fn propose(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<DraftTree> {
        Ok((self.make)(committed, max_nodes))
    }

    fn observe(&mut self, outcome: &Outcome, _hidden: Hidden) -> Result<()> {
        self.outcomes.push(outcome.clone());
        Ok(())
    }
}

/// A small deterministic generator for test trees.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
}

/// A random tree of up to `max_nodes` nodes over `vocab`, whose first branch follows `truth`
/// (the continuation a reference run produced) for a random number of steps, so that some
/// drafts are accepted and some are not.
pub fn random_tree(rng: &mut Lcg, truth: &[TokenId], vocab: u32, max_nodes: usize) -> DraftTree {
    let mut t = DraftTree::new();
    if max_nodes == 0 {
        return t;
    }
    let follow = (rng.next_u32() as usize % (truth.len() + 1)).min(max_nodes);
    let mut parent: Option<NodeId> = None;
    for &tok in &truth[..follow] {
        parent = Some(t.push(parent, tok, None).expect("fresh chain"));
    }
    while t.len() < max_nodes && !rng.next_u32().is_multiple_of(4) {
        let p = match rng.next_u32() as usize % (t.len() + 1) {
            0 => None,
            i => Some(NodeId(i as u32 - 1)),
        };
        let _ = t.push(p, TokenId(rng.next_u32() % vocab), None); // a repeated sibling is skipped
    }
    t
}
