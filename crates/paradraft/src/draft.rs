//! Draft trees. A chain is a tree with one branch. Nodes are stored parents-first; siblings
//! carry distinct tokens (so at most one child can match a target choice, docs/sampling.md).

use crate::error::{Error, Result};
use crate::model::TreeMask;
use crate::sample::Dist;
use crate::types::{Pos, TokenId};

/// Index of a node in its [`DraftTree`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

#[derive(Clone, Debug, Default)]
pub struct DraftTree {
    tokens: Vec<TokenId>,
    /// `None`: a child of the root (the last committed token).
    parents: Vec<Option<NodeId>>,
    /// 1 for the root's children.
    depths: Vec<u32>,
    /// The drafter's distribution at each node's parent, when it sampled from one.
    q: Vec<Option<Dist>>,
}

/// The verification forward's input: row 0 is the root, row i + 1 is node i.
#[derive(Clone, Debug)]
pub struct Linearised {
    pub tokens: Vec<TokenId>,
    pub positions: Vec<Pos>,
    pub mask: TreeMask,
}

impl DraftTree {
    pub fn new() -> Self {
        Self::default()
    }

    /// A single branch.
    pub fn chain(tokens: &[TokenId]) -> Self {
        let mut t = DraftTree::new();
        let mut parent = None;
        for &tok in tokens {
            parent = Some(t.push(parent, tok, None).expect("a chain is a valid tree"));
        }
        t
    }

    /// Adds a node under `parent` (`None` = under the root); `q` is the distribution the token
    /// was sampled from, if any.
    pub fn push(
        &mut self,
        parent: Option<NodeId>,
        token: TokenId,
        q: Option<Dist>,
    ) -> Result<NodeId> {
        if let Some(p) = parent {
            if p.idx() >= self.len() {
                return Err(Error::BadRequest(format!(
                    "draft parent {} does not exist",
                    p.0
                )));
            }
        }
        if self.children(parent).any(|c| self.tokens[c.idx()] == token) {
            return Err(Error::BadRequest(format!(
                "draft token {} repeated among siblings",
                token.0
            )));
        }
        let depth = parent.map_or(1, |p| self.depths[p.idx()] + 1);
        self.tokens.push(token);
        self.parents.push(parent);
        self.depths.push(depth);
        self.q.push(q);
        Ok(NodeId(self.tokens.len() as u32 - 1))
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn token(&self, n: NodeId) -> TokenId {
        self.tokens[n.idx()]
    }

    pub fn parent(&self, n: NodeId) -> Option<NodeId> {
        self.parents[n.idx()]
    }

    pub fn depth(&self, n: NodeId) -> u32 {
        self.depths[n.idx()]
    }

    /// The tokens from the first level down to `to` (none for `None`, the root's place).
    pub fn path(&self, to: Option<NodeId>) -> Vec<TokenId> {
        let mut path = Vec::with_capacity(to.map_or(0, |n| self.depth(n) as usize));
        let mut at = to;
        while let Some(v) = at {
            path.push(self.token(v));
            at = self.parent(v);
        }
        path.reverse();
        path
    }

    pub fn q(&self, n: NodeId) -> Option<&Dist> {
        self.q[n.idx()].as_ref()
    }

    /// The depth (1-based) of the first node, in node order, whose token `is_stop` says ends
    /// the text (what adaptive draft length reads).
    pub fn stop_depth(&self, is_stop: impl Fn(TokenId) -> bool) -> Option<usize> {
        (0..self.len() as u32)
            .map(NodeId)
            .find(|&n| is_stop(self.token(n)))
            .map(|n| self.depth(n) as usize)
    }

    /// How many of `tokens` (a path from the root: e.g. what the target accepted) this tree
    /// holds, from the first on.
    pub fn path_len(&self, tokens: &[TokenId]) -> usize {
        let mut at = None;
        for (n, &t) in tokens.iter().enumerate() {
            match self.children(at).find(|&c| self.token(c) == t) {
                Some(c) => at = Some(c),
                None => return n,
            }
        }
        tokens.len()
    }

    pub fn max_depth(&self) -> u32 {
        self.depths.iter().copied().max().unwrap_or(0)
    }

    pub fn is_chain(&self) -> bool {
        self.parents.iter().enumerate().all(|(i, p)| match p {
            None => i == 0,
            Some(p) => p.idx() + 1 == i,
        })
    }

    /// Children of `parent` (`None` = the root), in insertion order.
    pub fn children(&self, parent: Option<NodeId>) -> impl Iterator<Item = NodeId> + '_ {
        self.parents
            .iter()
            .enumerate()
            .filter(move |(_, p)| **p == parent)
            .map(|(i, _)| NodeId(i as u32))
    }

    /// Keeps the first `n` nodes (parents precede children, so the result is a tree).
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.parents.truncate(n);
        self.depths.truncate(n);
        self.q.truncate(n);
    }

    /// Rows for the verification forward: the root at position `root_pos`, each node at
    /// `root_pos + depth`, each seeing its ancestors and the root.
    pub fn linearise(&self, root: TokenId, root_pos: usize) -> Linearised {
        let mut tokens = Vec::with_capacity(self.len() + 1);
        tokens.push(root);
        tokens.extend(&self.tokens);
        let mut positions = vec![Pos(root_pos as u32)];
        positions.extend(self.depths.iter().map(|&d| Pos(root_pos as u32 + d)));
        let parents: Vec<Option<usize>> = std::iter::once(None)
            .chain(
                self.parents
                    .iter()
                    .map(|p| Some(p.map_or(0, |p| p.idx() + 1))),
            )
            .collect();
        let mask = TreeMask::from_parents(&parents).expect("parents precede children");
        Linearised {
            tokens,
            positions,
            mask,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_len_follows_the_tree_from_the_root() {
        let mut t = DraftTree::new();
        let a = t.push(None, TokenId(1), None).unwrap();
        t.push(None, TokenId(2), None).unwrap();
        let c = t.push(Some(a), TokenId(3), None).unwrap();
        t.push(Some(c), TokenId(4), None).unwrap();
        let tok = |v: &[u32]| v.iter().map(|&x| TokenId(x)).collect::<Vec<_>>();
        assert_eq!(t.path_len(&tok(&[1, 3, 4, 9])), 3);
        assert_eq!(t.path_len(&tok(&[1, 3])), 2);
        assert_eq!(t.path_len(&tok(&[2, 3])), 1, "3 is under 1, not 2");
        assert_eq!(t.path_len(&tok(&[3])), 0);
        assert_eq!(t.path_len(&[]), 0);
    }

    #[test]
    fn linearisation_positions_and_mask() {
        let mut t = DraftTree::new();
        let a = t.push(None, TokenId(10), None).unwrap();
        let b = t.push(None, TokenId(11), None).unwrap();
        let c = t.push(Some(a), TokenId(12), None).unwrap();
        assert!(
            t.push(None, TokenId(10), None).is_err(),
            "siblings are distinct"
        );
        assert!(t.push(Some(NodeId(9)), TokenId(1), None).is_err());
        let l = t.linearise(TokenId(5), 100);
        assert_eq!(
            l.tokens,
            vec![TokenId(5), TokenId(10), TokenId(11), TokenId(12)]
        );
        assert_eq!(l.positions, vec![Pos(100), Pos(101), Pos(101), Pos(102)]);
        // row 3 (node c) sees the root, a and itself, not b
        assert!(l.mask.get(3, 0) && l.mask.get(3, 1) && l.mask.get(3, 3) && !l.mask.get(3, 2));
        assert!(!l.mask.get(2, 1));
        assert_eq!(t.children(None).collect::<Vec<_>>(), vec![a, b]);
        assert_eq!(t.children(Some(a)).collect::<Vec<_>>(), vec![c]);
        assert!(!t.is_chain());
        assert!(DraftTree::chain(&[TokenId(1), TokenId(2), TokenId(3)]).is_chain());
    }
}
