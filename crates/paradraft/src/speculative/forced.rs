//! Tokens a grammar forces, drafted for free: when the bytes that must come next are known
//! (JSON punctuation, a schema's keys), their tokens go first in the round's tree as a chain,
//! and the drafter's tree is grafted under it where it agrees with them (its nodes that
//! disagree could never be accepted: the grammar gives them probability 0).
//!
//! They are drafts like any other — verified, so nothing about losslessness changes — but the
//! drafter hears of the round in its own terms ([`Grafted::drafter_outcome`]): its own nodes,
//! as far as the accepted path ran through them.

use super::tree::{DraftTree, NodeId};
use super::verify::{Candidates, Outcome};
use crate::error::Result;
use crate::types::TokenId;

/// A round's tree made of a forced chain and the drafter's tree.
pub struct Grafted {
    /// What the drafter proposed (as the sizer cut it).
    pub drafted: DraftTree,
    /// Per node of the verified tree, the drafter's node it stands for.
    of: Vec<Option<NodeId>>,
}

/// The forced chain `forced`, then the nodes of `drafted` that agree with it and whose path
/// the grammar `allows` (at most `room` nodes in all): the tree to verify, and how it maps
/// back. A node the grammar forbids could never be accepted, so it is cut with its subtree
/// before it costs a verify row.
pub fn graft(
    forced: &[TokenId],
    drafted: DraftTree,
    room: usize,
    allows: &mut dyn FnMut(&[TokenId]) -> bool,
) -> Result<(DraftTree, Grafted)> {
    let forced = &forced[..forced.len().min(room)];
    let k = forced.len();
    let mut tree = DraftTree::chain(forced);
    let mut of: Vec<Option<NodeId>> = vec![None; k];
    // Where each drafted node went in `tree` (None: dropped).
    let mut at: Vec<Option<NodeId>> = Vec::with_capacity(drafted.len());
    for i in 0..drafted.len() {
        let n = NodeId(i as u32);
        let d = drafted.depth(n) as usize;
        let parent = match drafted.parent(n) {
            None => Some(None),
            Some(p) => at[p.idx()].map(Some),
        };
        let placed = match parent {
            // Under a node that was dropped: dropped.
            None => None,
            Some(_) if d <= k => {
                // Within the chain: it stands for the chain's node at its depth if it has its
                // token (its parent, placed, is the chain's node above).
                (drafted.token(n) == forced[d - 1]).then(|| {
                    let v = NodeId(d as u32 - 1);
                    of[v.idx()] = Some(n);
                    v
                })
            }
            Some(p) if tree.len() < room && allows(&path_to(&tree, p, drafted.token(n))) => {
                let v = tree.push(p, drafted.token(n), drafted.q(n).cloned())?;
                of.push(Some(n));
                Some(v)
            }
            Some(_) => None,
        };
        at.push(placed);
    }
    Ok((tree, Grafted { drafted, of }))
}

/// The tokens from the root to `parent` in `tree`, then `last`.
fn path_to(tree: &DraftTree, parent: Option<NodeId>, last: TokenId) -> Vec<TokenId> {
    let mut path = tree.path(parent);
    path.push(last);
    path
}

impl Grafted {
    /// The round as the drafter sees it: its accepted nodes are the accepted path's as long as
    /// the path runs through its nodes; the token after them is its bonus. (The hidden states
    /// it is given still cover every committed position.)
    pub fn drafter_outcome(&self, o: &Outcome) -> Outcome {
        let accepted: Vec<NodeId> = o
            .accepted
            .iter()
            .map_while(|v| self.of.get(v.idx()).copied().flatten())
            .collect();
        let bonus = match o.tokens.get(accepted.len()) {
            Some(&t) => t,
            None => o.bonus,
        };
        Outcome {
            tokens: accepted.iter().map(|&n| self.drafted.token(n)).collect(),
            accepted,
            bonus,
            drafted: self.drafted.len(),
            top: Candidates::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ids: &[u32]) -> Vec<TokenId> {
        ids.iter().map(|&i| TokenId(i)).collect()
    }

    #[test]
    fn the_drafters_nodes_that_agree_are_grafted_under_the_chain() {
        // Drafted: 1 → 2 → 7, 1 → 3, 9 (the forced chain is 1 → 2).
        let mut d = DraftTree::new();
        let a = d.push(None, TokenId(1), None).unwrap();
        let b = d.push(Some(a), TokenId(2), None).unwrap();
        let c = d.push(Some(b), TokenId(7), None).unwrap();
        d.push(Some(a), TokenId(3), None).unwrap();
        d.push(None, TokenId(9), None).unwrap();
        d.push(Some(c), TokenId(8), None).unwrap();
        let (tree, g) = graft(&t(&[1, 2]), d, 16, &mut |_| true).unwrap();
        // 1 → 2 (the chain, standing for drafted a, b), then 7 → 8 under 2.
        assert_eq!(tree.len(), 4);
        assert_eq!(
            (0..4).map(|i| tree.token(NodeId(i)).0).collect::<Vec<_>>(),
            vec![1, 2, 7, 8]
        );
        assert_eq!(tree.parent(NodeId(2)), Some(NodeId(1)));
        assert_eq!(tree.parent(NodeId(3)), Some(NodeId(2)));
        // The target accepted 1, 2, 7 and then said 5: the drafter's a, b, c, bonus 5.
        let o = Outcome {
            accepted: vec![NodeId(0), NodeId(1), NodeId(2)],
            tokens: t(&[1, 2, 7]),
            bonus: TokenId(5),
            drafted: 4,
            top: Candidates::default(),
        };
        let mine = g.drafter_outcome(&o);
        assert_eq!(mine.accepted, vec![NodeId(0), NodeId(1), NodeId(2)]);
        assert_eq!(mine.tokens, t(&[1, 2, 7]));
        assert_eq!(mine.bonus, TokenId(5));
        assert_eq!(mine.drafted, 6);
        // Room for 3 nodes: the chain and 7 only.
        let mut d = DraftTree::new();
        let a = d.push(None, TokenId(1), None).unwrap();
        let b = d.push(Some(a), TokenId(2), None).unwrap();
        let c = d.push(Some(b), TokenId(7), None).unwrap();
        d.push(Some(c), TokenId(8), None).unwrap();
        assert_eq!(graft(&t(&[1, 2]), d, 3, &mut |_| true).unwrap().0.len(), 3);
    }

    #[test]
    fn nodes_the_grammar_forbids_are_cut_with_their_subtrees() {
        // Drafted: 1 → 7 → 8, 1 → 3; nothing forced; the grammar forbids 7 after 1.
        let mut d = DraftTree::new();
        let a = d.push(None, TokenId(1), None).unwrap();
        let b = d.push(Some(a), TokenId(7), None).unwrap();
        d.push(Some(b), TokenId(8), None).unwrap();
        d.push(Some(a), TokenId(3), None).unwrap();
        let mut asked = vec![];
        let (tree, g) = graft(&[], d, 16, &mut |path| {
            asked.push(path.to_vec());
            path != t(&[1, 7]).as_slice()
        })
        .unwrap();
        assert_eq!(
            (0..tree.len() as u32)
                .map(|i| tree.token(NodeId(i)).0)
                .collect::<Vec<_>>(),
            vec![1, 3]
        );
        // Each placed node's whole path was asked once; 8 (under a cut node) never.
        assert_eq!(asked, vec![t(&[1]), t(&[1, 7]), t(&[1, 3])]);
        let o = Outcome {
            accepted: vec![NodeId(0), NodeId(1)],
            tokens: t(&[1, 3]),
            bonus: TokenId(2),
            drafted: 2,
            top: Candidates::default(),
        };
        let mine = g.drafter_outcome(&o);
        assert_eq!(mine.accepted, vec![NodeId(0), NodeId(3)]);
        assert_eq!(mine.drafted, 4);
    }

    #[test]
    fn a_drafter_that_disagrees_hears_its_nodes_were_not_reached() {
        let mut d = DraftTree::new();
        d.push(None, TokenId(4), None).unwrap();
        let (tree, g) = graft(&t(&[1, 2, 3]), d, 16, &mut |_| true).unwrap();
        assert_eq!(tree.len(), 3);
        let o = Outcome {
            accepted: vec![NodeId(0), NodeId(1)],
            tokens: t(&[1, 2]),
            bonus: TokenId(6),
            drafted: 3,
            top: Candidates::default(),
        };
        let mine = g.drafter_outcome(&o);
        assert!(mine.accepted.is_empty());
        // The first token after the (empty) accepted path is the first committed one.
        assert_eq!(mine.bonus, TokenId(1));
        assert_eq!(mine.drafted, 1);
    }
}
