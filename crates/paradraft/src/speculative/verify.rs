//! Verification rules (docs/sampling.md). All are lossless for the drafts they are given:
//!
//! - **Greedy** (chain or tree): walk from the root; at each node the target's argmax there
//!   must equal one child's token (siblings are distinct, so at most one can), which is then
//!   accepted. The bonus is the argmax after the last accepted node. Every committed token is
//!   the target's argmax given the committed prefix, i.e. exactly AR greedy.
//! - **Coupled** sampling ([`VerifyRule::Coupled`], the default at T > 0): the same walk, with
//!   the target's *sample* at each node in place of its argmax. Samples are Gumbel-max draws
//!   keyed by (seed, absolute position) ([`crate::sample::Noise`]), so the token the target
//!   samples at a position given a prefix is fixed before anything is drafted; the walk commits
//!   exactly the tokens AR sampling with the same seed commits, whatever the drafts were.
//!   Distribution: the noise at position n is independent of everything that decided the
//!   prefix before n, so each token is an exact draw from p(· | prefix). Acceptance of a
//!   one-hot sibling set is P(y ∈ siblings), y ~ p, as with the rejection rule; a drafter that
//!   samples from q with the same keyed noise matches the target with the Gumbel-coupling
//!   probability.
//! - **Rejection** sampling ([`VerifyRule::Rejection`]), the classic rules with keyed uniforms:
//!   - *one-hot proposals* (chain or tree, drafts treated as point masses): at a node with
//!     target distribution p, try its children x₁, x₂, … in order: accept xᵢ with probability
//!     r(xᵢ) / Σr, where r starts as p; on rejection set r(xᵢ) = 0 (renormalising implicitly).
//!     If no child is accepted the bonus is drawn from r. Proof sketch: drawing y ~ r is the
//!     same as "with probability r(x)/Σr output x, else draw from r without x"; applying this
//!     once per distinct sibling therefore outputs a token distributed as p, whatever the
//!     drafts are.
//!   - *proposals with known q* (chains whose tokens the drafter sampled from q): accept x with
//!     probability min(1, p(x)/q(x)), else draw the bonus from norm(max(p − q, 0)). Proof sketch
//!     (Leviathan et al.): P(out = y) = q(y)·min(1, p/q) + (1 − Σ min(p, q))·
//!     max(p − q, 0)(y)/Σ max(p − q, 0) = min(p, q)(y) + max(p − q, 0)(y) = p(y).
//!
//!   Acceptance of a known-q draft is Σ min(p, q), at least the coupling's.
//!
//!   These rules draw only from noise streams no drafter reads (the acceptance tests, the
//!   residual, [`Noise::FREE`] where a node has no children); drafters may read the token
//!   stream, so that coupled drafting can pick what the target will sample. A draft may then
//!   depend on the target's token noise at any position — which tokens, how many, whether any
//!   — and the rules above still hold: every draw they make is independent of the draft. The
//!   output is a draw from AR's distribution, not AR's own tokens for the seed.
//!
//! Every rule draws from the same [`Sampler`] distribution (temperature → top-k → top-p) that AR
//! decoding uses, so "the target's distribution" means the same thing in both.

use super::tree::{DraftTree, NodeId};
use crate::process::Exact;
use crate::sample::{Dist, Noise, Sampler};
use crate::types::TokenId;

/// How a round is verified at temperature > 0 (temperature 0 is always greedy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerifyRule {
    /// Accept the child that equals the target's keyed sample: output token-identical to AR
    /// sampling with the same seed.
    #[default]
    Coupled,
    /// Recursive rejection / min(1, p/q) with keyed uniforms: equal in distribution to AR.
    Rejection,
}

impl std::str::FromStr for VerifyRule {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "coupled" => Ok(VerifyRule::Coupled),
            "rejection" => Ok(VerifyRule::Rejection),
            _ => Err(format!(
                "verification rule `{s}`: expected coupled or rejection"
            )),
        }
    }
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
    /// The target's best candidates at every verified row, when the drafter asked for them
    /// ([`super::Drafter::candidates`]); empty otherwise.
    pub top: Candidates,
}

/// The target's `k` best candidates per verified row, best first, rows in forward order (the
/// root, then the nodes: [`row_of`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Candidates {
    pub k: usize,
    /// `rows × k` ids.
    pub ids: Vec<TokenId>,
}

impl Candidates {
    /// Verified rows with candidates.
    pub fn rows(&self) -> usize {
        self.ids.len().checked_div(self.k).unwrap_or(0)
    }

    /// Row `r`'s candidates, best first.
    pub fn row(&self, r: usize) -> &[TokenId] {
        &self.ids[r * self.k..(r + 1) * self.k]
    }
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
    verify_match(tree, |row| argmax[row])
}

/// Coupled rule: the target's keyed sample at each node (row 0 is the root, at position
/// `root_pos`; a row's logits predict the position after its node). With `rescore` the rows
/// are approximate and each draw re-scores its candidates exactly
/// ([`Sampler::sample_rescored`]).
pub fn verify_coupled<'a>(
    tree: &DraftTree,
    logits: impl Fn(usize) -> &'a [f32],
    sampler: &Sampler,
    root_pos: usize,
    rescore: Option<Exact>,
) -> Outcome {
    verify_match(tree, |row| {
        let depth = if row == 0 {
            0
        } else {
            tree.depth(NodeId(row as u32 - 1)) as usize
        };
        let pos = root_pos + depth + 1;
        match rescore {
            Some((exact, margin)) => {
                sampler.sample_rescored(logits(row), pos, |t| exact(row, t), margin)
            }
            None => sampler.sample_at(logits(row), pos),
        }
    })
}

/// Walks from the root accepting the child whose token is the target's own (`target(row)`).
fn verify_match(tree: &DraftTree, mut target: impl FnMut(usize) -> TokenId) -> Outcome {
    let mut cur: Option<NodeId> = None;
    let mut accepted = Vec::new();
    loop {
        let want = target(row_of(cur));
        match tree.children(cur).find(|&c| tree.token(c) == want) {
            Some(c) => {
                accepted.push(c);
                cur = Some(c);
            }
            None => return finish(tree, accepted, want),
        }
    }
}

fn finish(tree: &DraftTree, accepted: Vec<NodeId>, bonus: TokenId) -> Outcome {
    Outcome {
        tokens: accepted.iter().map(|&n| tree.token(n)).collect(),
        accepted,
        bonus,
        drafted: tree.len(),
        top: Candidates::default(),
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

/// Rejection rules over per-row target logits, with uniforms keyed by position (row 0 is the
/// root, at position `root_pos`).
pub fn verify_rejection<'a>(
    tree: &DraftTree,
    logits: impl Fn(usize) -> &'a [f32],
    sampler: &Sampler,
    root_pos: usize,
) -> Outcome {
    let mut cur: Option<NodeId> = None;
    let mut accepted = Vec::new();
    loop {
        // The position the children of `cur` stand at.
        let pos = root_pos + accepted.len() + 1;
        let uniform = |stream: u32| sampler.noise.key(pos, stream).uniform();
        let children: Vec<NodeId> = tree.children(cur).collect();
        if children.is_empty() {
            // Nothing to verify below this node: an ordinary draw from p, with noise no
            // drafter read (whether this node has children may depend on the token stream).
            let bonus =
                sampler.sample_keyed(logits(row_of(cur)), sampler.noise.key(pos, Noise::FREE));
            return finish(tree, accepted, bonus);
        }
        let p = sampler.dist(logits(row_of(cur)));
        // Known q on the only child: standard speculative sampling.
        if let (1, Some(q)) = (children.len(), tree.q(children[0])) {
            let x = tree.token(children[0]);
            let (px, qx) = (p.prob(x), q.prob(x));
            if qx > 0.0 && uniform(1) < (px / qx).min(1.0) {
                accepted.push(children[0]);
                cur = Some(children[0]);
                continue;
            }
            let residual = residual(&p, q);
            let key = sampler.noise.key(pos, Noise::RESIDUAL);
            let bonus = if residual.iter().any(|e| e.1 > 0.0) {
                draw_weighted(residual.iter().copied(), key.uniform())
            } else {
                key.pick(&p)
            };
            return finish(tree, accepted, bonus);
        }
        // One-hot proposals: recursive rejection over the siblings. The residual r is p with
        // the rejected tokens removed; it is kept implicitly (the removed tokens and their mass).
        let sum_p: f32 = p.entries.iter().map(|e| e.1).sum();
        let (mut removed, mut removed_mass) = (Vec::new(), 0f32);
        let mut next = None;
        for (i, &c) in children.iter().enumerate() {
            let x = tree.token(c);
            let px = p.prob(x);
            if px <= 0.0 {
                continue; // outside p's support: rejected, r unchanged
            }
            let total = sum_p - removed_mass;
            if total > 0.0 && uniform(1 + i as u32) < px / total {
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
                let u = uniform(Noise::RESIDUAL);
                let r = p
                    .entries
                    .iter()
                    .map(|&(t, w)| (t, if removed.contains(&t) { 0.0 } else { w }));
                return finish(tree, accepted, draw_weighted(r, u));
            }
        }
    }
}

/// Verifies a round by `rule` at temperature > 0, or greedily at 0 (`argmax` per row then).
/// `rescore`: the coupled rule's rows are approximate ([`verify_coupled`]); the rejection rule
/// reads its rows as they are (full rows).
pub fn verify<'a>(
    rule: VerifyRule,
    tree: &DraftTree,
    argmax: &[TokenId],
    logits: impl Fn(usize) -> &'a [f32],
    sampler: &Sampler,
    root_pos: usize,
    rescore: Option<Exact>,
) -> Outcome {
    if sampler.params.is_greedy() {
        return verify_greedy(tree, argmax);
    }
    match rule {
        VerifyRule::Coupled => verify_coupled(tree, logits, sampler, root_pos, rescore),
        VerifyRule::Rejection => verify_rejection(tree, logits, sampler, root_pos),
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

    /// Asserts that the first committed token of each sampling rule over trees from `tree`
    /// (given the sampler and the root's position) is distributed as the sampler's p for
    /// [`LOGITS`] (200 000 rounds at distinct positions, ±0.005 per token).
    fn assert_first_token_follows_p(seed: u64, mut tree: impl FnMut(&Sampler, usize) -> DraftTree) {
        let s = Sampler::new(SamplingParams {
            temperature: 1.0,
            seed,
            ..Default::default()
        })
        .unwrap();
        let p = s.dist(&LOGITS);
        let n = 200_000;
        for rule in [VerifyRule::Coupled, VerifyRule::Rejection] {
            let mut counts = [0usize; 5];
            for pos in 0..n {
                let t = tree(&s, pos);
                let o = verify(rule, &t, &[], |_| &LOGITS[..], &s, pos, None);
                counts[o.committed().next().unwrap().idx()] += 1;
            }
            for (i, c) in counts.iter().enumerate() {
                let want = p.prob(TokenId(i as u32)) as f64;
                assert!(
                    (*c as f64 / n as f64 - want).abs() < 0.005,
                    "{rule:?} {i}: {c} vs {want}"
                );
            }
        }
    }

    /// One-hot tree rejection over two siblings.
    #[test]
    fn one_hot_rejection_preserves_p() {
        let mut t = DraftTree::new();
        t.push(None, TokenId(2), None).unwrap();
        t.push(None, TokenId(0), None).unwrap();
        assert_first_token_follows_p(3, |_, _| t.clone());
    }

    /// With a known q on a chain, accept-with-min(1, p/q) plus the residual gives p; so does
    /// the coupled rule. The draft uses the same keyed noise as the target (coupled drafting).
    #[test]
    fn speculative_sampling_with_q_preserves_p() {
        let q = Dist {
            entries: vec![(TokenId(1), 0.6), (TokenId(3), 0.3), (TokenId(4), 0.1)],
        };
        assert_first_token_follows_p(5, |s, pos| {
            let mut t = DraftTree::new();
            t.push(None, s.pick_at(&q, pos + 1), Some(q.clone()))
                .unwrap();
            t
        });
    }

    /// Drafts that read the target's token noise — which token, and whether there is a draft
    /// at all — leave both rules exact: the rejection rules draw from other streams. (Had the
    /// rejection rule's draw below an undrafted node used the token stream, token 4 would come
    /// out with probability p₄ + (1 − p₄)·p₄ here.)
    #[test]
    fn drafts_that_read_the_token_noise_keep_p() {
        assert_first_token_follows_p(17, |s, pos| {
            let mut t = DraftTree::new();
            let sampled = s.sample_at(&LOGITS, pos + 1);
            if sampled != TokenId(4) {
                t.push(None, sampled, None).unwrap();
            }
            t
        });
    }

    /// The coupled rule commits the target's keyed sample whatever was drafted: the same
    /// tokens as sampling at each position directly.
    #[test]
    fn coupled_rule_commits_the_keyed_samples() {
        let s = Sampler::new(SamplingParams {
            temperature: 0.9,
            seed: 11,
            ..Default::default()
        })
        .unwrap();
        for pos in 0..2_000 {
            let truth = s.sample_at(&LOGITS, pos + 1);
            let mut t = DraftTree::new();
            let a = t.push(None, TokenId((pos % 5) as u32), None).unwrap();
            t.push(Some(a), s.sample_at(&LOGITS, pos + 2), None)
                .unwrap();
            let o = verify_coupled(&t, |_| &LOGITS[..], &s, pos, None);
            assert_eq!(o.committed().next(), Some(truth));
            if o.tokens.len() == 2 {
                assert_eq!(o.bonus, s.sample_at(&LOGITS, pos + 3));
            }
        }
    }
}
