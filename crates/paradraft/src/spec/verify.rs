//! Verification rules (spec §1.1). All are lossless for the drafts they are given:
//!
//! - **Greedy** (chain or tree): walk from the root; at each node the target's argmax there
//!   must equal one child's token (siblings are distinct, so at most one can), which is then
//!   accepted. The bonus is the argmax after the last accepted node. Every committed token is
//!   the target's argmax given the committed prefix, i.e. exactly AR greedy.
//! - **Sampling, one-hot proposals** (chain or tree, drafts treated as point masses): at a node
//!   with target distribution p, try its children x₁, x₂, … in order: accept xᵢ with probability
//!   r(xᵢ) / Σr, where r starts as p; on rejection set r(xᵢ) = 0 (renormalising implicitly). If
//!   no child is accepted the bonus is drawn from r. Proof sketch: drawing y ~ r is the same as
//!   "with probability r(x)/Σr output x, else draw from r without x"; applying this once per
//!   distinct sibling therefore outputs a token distributed as p, whatever the drafts are.
//! - **Sampling, proposals with known q** (chains whose tokens the drafter sampled from q):
//!   accept x with probability min(1, p(x)/q(x)), else draw the bonus from norm(max(p − q, 0)).
//!   Proof sketch (Leviathan et al.): P(out = y) = q(y)·min(1, p/q) + (1 − Σ min(p, q))·
//!   max(p − q, 0)(y)/Σ max(p − q, 0) = min(p, q)(y) + max(p − q, 0)(y) = p(y).
//!
//! Every rule draws from the same [`Sampler`] distribution (temperature → top-k → top-p) that AR
//! decoding uses, so "the target's distribution" means the same thing in both.

use super::tree::{DraftTree, NodeId};
use crate::sample::{Dist, Sampler};
use crate::types::TokenId;

/// Which rule verifies a round: greedy at temperature 0, else sampling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    Greedy,
    Sample,
}

/// What the target made of one proposal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Accepted nodes, root to leaf.
    pub accepted: Vec<NodeId>,
    /// Their tokens.
    pub tokens: Vec<TokenId>,
    /// The target's own next token after the accepted path (recovered or bonus).
    pub bonus: TokenId,
    /// Nodes the drafter proposed.
    pub drafted: usize,
}

impl Outcome {
    /// Tokens committed by this round: the accepted ones, then the bonus.
    pub fn committed(&self) -> impl Iterator<Item = TokenId> + '_ {
        self.tokens
            .iter()
            .copied()
            .chain(std::iter::once(self.bonus))
    }
}

/// Row of the verification forward that holds node `n` (row 0 is the root).
pub fn row_of(n: Option<NodeId>) -> usize {
    n.map_or(0, |n| n.idx() + 1)
}

/// Greedy rule over per-row argmaxes (`argmax[row]`).
pub fn verify_greedy(tree: &DraftTree, argmax: &[TokenId]) -> Outcome {
    let mut cur: Option<NodeId> = None;
    let mut accepted = Vec::new();
    loop {
        let want = argmax[row_of(cur)];
        match tree.children(cur).find(|&c| tree.token(c) == want) {
            Some(c) => {
                accepted.push(c);
                cur = Some(c);
            }
            None => break,
        }
    }
    finish(tree, accepted, argmax[row_of(cur)])
}

fn finish(tree: &DraftTree, accepted: Vec<NodeId>, bonus: TokenId) -> Outcome {
    Outcome {
        tokens: accepted.iter().map(|&n| tree.token(n)).collect(),
        accepted,
        bonus,
        drafted: tree.len(),
    }
}

/// Draws from unnormalised non-negative weights (two passes over them).
fn draw_weighted(entries: impl Iterator<Item = (TokenId, f32)> + Clone, u: f32) -> TokenId {
    let total: f32 = entries.clone().map(|e| e.1).sum();
    let mut acc = 0.0;
    let mut last = None;
    for (t, w) in entries {
        if w > 0.0 {
            last = Some(t);
        }
        acc += w;
        if u * total < acc {
            return t;
        }
    }
    last.unwrap_or(TokenId(0))
}

/// Sampling rules over per-row target logits.
pub fn verify_sample<'a>(
    tree: &DraftTree,
    logits: impl Fn(usize) -> &'a [f32],
    sampler: &mut Sampler,
) -> Outcome {
    let mut cur: Option<NodeId> = None;
    let mut accepted = Vec::new();
    loop {
        let children: Vec<NodeId> = tree.children(cur).collect();
        if children.is_empty() {
            // Nothing to verify below this node: an ordinary draw from p.
            let bonus = sampler.sample(logits(row_of(cur)));
            return finish(tree, accepted, bonus);
        }
        let p = sampler.dist(logits(row_of(cur)));
        // Known q on the only child: standard speculative sampling.
        if let (1, Some(q)) = (children.len(), tree.q(children[0])) {
            let x = tree.token(children[0]);
            let (px, qx) = (p.prob(x), q.prob(x));
            if qx > 0.0 && sampler.uniform() < (px / qx).min(1.0) {
                accepted.push(children[0]);
                cur = Some(children[0]);
                continue;
            }
            let residual = residual(&p, q);
            let u = sampler.uniform();
            let bonus = if residual.iter().any(|e| e.1 > 0.0) {
                draw_weighted(residual.iter().copied(), u)
            } else {
                sampler.draw(&p)
            };
            return finish(tree, accepted, bonus);
        }
        // One-hot proposals: recursive rejection over the siblings. The residual r is p with
        // the rejected tokens removed; it is kept implicitly (the removed tokens and their mass).
        let sum_p: f32 = p.entries.iter().map(|e| e.1).sum();
        let (mut removed, mut removed_mass) = (Vec::new(), 0f32);
        let mut next = None;
        for &c in &children {
            let x = tree.token(c);
            let px = p.prob(x);
            if px <= 0.0 {
                continue; // outside p's support: rejected, r unchanged
            }
            let total = sum_p - removed_mass;
            if total > 0.0 && sampler.uniform() < px / total {
                next = Some(c);
                break;
            }
            removed.push(x);
            removed_mass += px;
        }
        match next {
            Some(c) => {
                accepted.push(c);
                cur = Some(c);
            }
            None => {
                let u = sampler.uniform();
                let r = p
                    .entries
                    .iter()
                    .map(|&(t, w)| (t, if removed.contains(&t) { 0.0 } else { w }));
                return finish(tree, accepted, draw_weighted(r, u));
            }
        }
    }
}

/// max(p − q, 0) over p's support (outside it the difference is never positive).
fn residual(p: &Dist, q: &Dist) -> Vec<(TokenId, f32)> {
    // q as a map: a drafter's q may cover thousands of ids in any order, and a lookup per
    // entry of p must not scan it.
    let qm: std::collections::HashMap<TokenId, f32> = q.entries.iter().copied().collect();
    p.entries
        .iter()
        .map(|&(t, pt)| (t, (pt - qm.get(&t).copied().unwrap_or(0.0)).max(0.0)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::SamplingParams;

    #[test]
    fn greedy_walks_the_matching_branch() {
        // root → {5 → {7, 8}, 6}; argmax per row: root 5, node0(5) 8, node1(6) 1, node2(7) 2, node3(8) 9
        let mut t = DraftTree::new();
        let a = t.push(None, TokenId(5), None).unwrap();
        t.push(None, TokenId(6), None).unwrap();
        t.push(Some(a), TokenId(7), None).unwrap();
        t.push(Some(a), TokenId(8), None).unwrap();
        let am = [TokenId(5), TokenId(8), TokenId(1), TokenId(2), TokenId(9)];
        let o = verify_greedy(&t, &am);
        assert_eq!(o.tokens, vec![TokenId(5), TokenId(8)]);
        assert_eq!(o.accepted, vec![NodeId(0), NodeId(3)]);
        assert_eq!(o.bonus, TokenId(9));
        let o = verify_greedy(&t, &[TokenId(3); 5]);
        assert!(o.tokens.is_empty());
        assert_eq!(o.bonus, TokenId(3));
    }

    const LOGITS: [f32; 5] = [1.0, 0.5, 0.0, -0.5, 2.0];

    /// Asserts that the first committed token of `verify_sample` over trees from `tree` is
    /// distributed as the sampler's p for [`LOGITS`] (200 000 draws, ±0.005 per token).
    fn assert_first_token_follows_p(seed: u64, mut tree: impl FnMut(&mut Sampler) -> DraftTree) {
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            seed,
            ..Default::default()
        })
        .unwrap();
        let p = s.dist(&LOGITS);
        let n = 200_000;
        let mut counts = [0usize; 5];
        for _ in 0..n {
            let t = tree(&mut s);
            let o = verify_sample(&t, |_| &LOGITS[..], &mut s);
            counts[o.committed().next().unwrap().idx()] += 1;
        }
        for (i, c) in counts.iter().enumerate() {
            let want = p.prob(TokenId(i as u32)) as f64;
            assert!(
                (*c as f64 / n as f64 - want).abs() < 0.005,
                "{i}: {c} vs {want}"
            );
        }
    }

    /// One-hot tree rejection over two siblings.
    #[test]
    fn one_hot_rejection_preserves_p() {
        let mut t = DraftTree::new();
        t.push(None, TokenId(2), None).unwrap();
        t.push(None, TokenId(0), None).unwrap();
        assert_first_token_follows_p(3, |_| t.clone());
    }

    /// With a known q on a chain, accept-with-min(1, p/q) plus the residual gives p.
    #[test]
    fn speculative_sampling_with_q_preserves_p() {
        let q = Dist {
            entries: vec![(TokenId(1), 0.6), (TokenId(3), 0.3), (TokenId(4), 0.1)],
        };
        assert_first_token_follows_p(5, |s| {
            let mut t = DraftTree::new();
            t.push(None, s.draw(&q), Some(q.clone())).unwrap();
            t
        });
    }
}
