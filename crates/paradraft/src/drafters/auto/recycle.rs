//! Token Recycling's source: for every token, the best candidates the target's output layer
//! gave the last time a verified row held that token. A verify forward computes them for every
//! row, accepted or not, so the table costs nothing to fill; drafting walks it from the root
//! (the root's candidates, then each candidate's own candidates, ...), a tree of guesses at
//! what the target would say next. Shared by every request of a process.

use crate::ngram::suffix::ContNode;
use crate::speculative::Candidates;
use crate::types::TokenId;

/// Candidates kept per token.
pub const K: usize = 8;
/// Children per node by depth (deeper: the last), and the most nodes a proposal has.
const WIDTHS: [usize; 4] = [4, 3, 2, 1];
const NODES: usize = 24;
/// Score of a candidate by its rank (the calibration's score buckets tell the ranks apart).
const RANK_SCORE: [f32; 4] = [0.9, 0.6, 0.4, 0.2];
/// Marks a token without candidates yet.
const EMPTY: TokenId = TokenId(u32::MAX);

/// Per token, the target's `K` best next tokens when it last verified a row holding it.
#[derive(Clone, Debug, Default)]
pub struct RecycleTable {
    next: Vec<[TokenId; K]>,
}

impl RecycleTable {
    /// The candidates recorded after `t`, best first (empty when none are).
    pub fn after(&self, t: TokenId) -> &[TokenId] {
        match self.next.get(t.0 as usize) {
            Some(c) if c[0] != EMPTY => c,
            _ => &[],
        }
    }

    /// Records the verified rows' candidates: row `r` held the token `row_token(r)`.
    pub fn learn(&mut self, top: &Candidates, row_token: impl Fn(usize) -> Option<TokenId>) {
        if top.k == 0 {
            return;
        }
        for r in 0..top.rows() {
            let Some(t) = row_token(r) else { break };
            let i = t.0 as usize;
            if i >= self.next.len() {
                self.next.resize(i + 1, [EMPTY; K]);
            }
            let row = top.row(r);
            let e = &mut self.next[i];
            for (j, slot) in e.iter_mut().enumerate() {
                *slot = row.get(j).or(row.last()).copied().unwrap_or(EMPTY);
            }
        }
    }

    /// A tree of at most `max_depth` levels walking the table from `root`: each node's
    /// children are the first candidates recorded after its token, scored by rank.
    pub fn tree(&self, root: TokenId, max_depth: usize) -> Vec<ContNode> {
        let mut nodes: Vec<(ContNode, usize)> = Vec::new();
        if max_depth > 0 {
            self.expand(None, root, 1, &mut nodes);
        }
        let mut i = 0;
        while i < nodes.len() && nodes.len() < NODES {
            let (token, d) = (nodes[i].0.token, nodes[i].1 + 1);
            if d <= max_depth {
                self.expand(Some(i), token, d, &mut nodes);
            }
            i += 1;
        }
        nodes.into_iter().map(|(n, _)| n).collect()
    }

    /// Appends the children at depth `d` of the node `parent` (holding `after`).
    fn expand(
        &self,
        parent: Option<usize>,
        after: TokenId,
        d: usize,
        nodes: &mut Vec<(ContNode, usize)>,
    ) {
        let width = WIDTHS[(d - 1).min(WIDTHS.len() - 1)];
        let mut seen = [EMPTY; K];
        for (rank, &token) in self.after(after).iter().enumerate() {
            if rank >= width || nodes.len() >= NODES {
                break;
            }
            if seen.contains(&token) {
                continue; // a padded row repeats its last id
            }
            seen[rank] = token;
            let share = RANK_SCORE[rank.min(RANK_SCORE.len() - 1)];
            nodes.push((
                ContNode {
                    parent,
                    token,
                    share,
                },
                d,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn top(rows: &[&[u32]]) -> Candidates {
        let k = rows[0].len();
        Candidates {
            k,
            ids: rows
                .iter()
                .flat_map(|r| r.iter().map(|&t| TokenId(t)))
                .collect(),
        }
    }

    /// The table keeps the latest candidates per token and walks them breadth first, widest
    /// at the root, never repeating a sibling, within the depth asked.
    #[test]
    fn learns_the_latest_candidates_and_walks_them() {
        let mut t = RecycleTable::default();
        assert!(t.tree(TokenId(1), 4).is_empty());
        let tokens = [1u32, 2, 3];
        let rows = top(&[
            &[2, 5, 6, 7, 7, 7, 7, 7],
            &[3, 9, 9, 9, 9, 9, 9, 9],
            &[4; 8],
        ]);
        t.learn(&rows, |r| tokens.get(r).map(|&x| TokenId(x)));
        assert_eq!(
            t.after(TokenId(1))[..3],
            [TokenId(2), TokenId(5), TokenId(6)]
        );
        assert!(t.after(TokenId(4)).is_empty() && t.after(TokenId(1000)).is_empty());
        let tree = t.tree(TokenId(1), 8);
        let toks: Vec<u32> = tree.iter().map(|n| n.token.0).collect();
        // Root's 4 best (7 once), then 2's children (3, 9), then 3's child (4).
        assert_eq!(toks, vec![2, 5, 6, 7, 3, 9, 4]);
        assert_eq!(tree[4].parent, Some(0));
        assert_eq!(tree[6].parent, Some(4));
        assert!(tree[0].share > tree[1].share);
        // Depth-limited.
        assert_eq!(t.tree(TokenId(1), 1).len(), 4);
        assert!(t.tree(TokenId(1), 0).is_empty());
        // A later row replaces what an earlier one said.
        t.learn(&top(&[&[8; 8]]), |_| Some(TokenId(1)));
        assert_eq!(t.after(TokenId(1))[0], TokenId(8));
        // No candidates, nothing learned.
        t.learn(&Candidates::default(), |_| Some(TokenId(5)));
        assert!(t.after(TokenId(5)).is_empty());
    }
}
