//! Continuity-aware tree search (DART §3.3, docs/dart.md, the code's semantics), for any drafter
//! that yields a distribution per depth in one pass (DART's shifted slots, DFlash's block).
//!
//! Each depth offers its top-k tokens with probabilities renormalised within the top-k. A beam
//! search walks the depths: a child's score is its parent's plus
//! `w_level(l) · (w_logit(l) · ln(p̃ + ε) + w_ng · ln(P_ngram + ε))`, with no n-gram term at
//! depth 1 (the shipped build's `NO_NGRAM_ON_FIRST_TOKEN`). Every child joins the candidate set;
//! the next beam is the best `beam` children, those ending in EOS ranked last. The tree is the
//! best `budget` candidates. Increments are clamped at 0, so a child never outscores its parent,
//! and ties are cut shallower-first: the kept set is always prefix-closed (the reference's
//! unstable sort can drop a parent on an exact tie).

use super::tree::{DraftTree, NodeId};
use crate::error::{Error, Result};
use crate::ngram::NgramTrie;
use crate::sample::Sampler;
use crate::types::TokenId;

/// The search's weights (defaults: DART's `tree_search_config`).
#[derive(Clone, Debug, PartialEq)]
pub struct TreeSearchParams {
    /// Candidates per depth.
    pub top_k: usize,
    pub beam: usize,
    /// `w_level(l) = (l + 1)^(−level_exp)`.
    pub level_exp: f32,
    /// `w_logit(l) = logit_decay^l`.
    pub logit_decay: f32,
    /// `w_ng`.
    pub ngram_weight: f32,
    pub eps: f32,
    /// Score depth 1 with the n-gram too (the paper's reading; the code skips it).
    pub ngram_on_first: bool,
}

impl Default for TreeSearchParams {
    fn default() -> Self {
        TreeSearchParams {
            top_k: 25,
            beam: 20,
            level_exp: 0.7,
            logit_decay: 0.9,
            ngram_weight: 0.5,
            eps: 1e-10,
            ngram_on_first: false,
        }
    }
}

/// One depth's candidates: target token ids and their probabilities within the top-k.
#[derive(Clone, Debug, Default)]
pub struct Level {
    pub tokens: Vec<TokenId>,
    pub probs: Vec<f32>,
}

impl Level {
    /// The top `k` of a logits row (over a possibly reduced vocabulary, mapped to target ids by
    /// `to_target`), softmax-renormalised among themselves at temperature 1.
    pub fn from_logits(row: &[f32], k: usize, to_target: impl Fn(usize) -> TokenId) -> Level {
        Self::from_logits_in(row, k, to_target, &mut vec![])
    }

    /// [`Level::from_logits`] with a reusable index buffer (the drafting hot path).
    pub fn from_logits_in(
        row: &[f32],
        k: usize,
        to_target: impl Fn(usize) -> TokenId,
        idx: &mut Vec<u32>,
    ) -> Level {
        // Higher logit first, ties to the lower id (a deterministic top-k).
        idx.clear();
        idx.extend(crate::runtime::ops::top_k(row, k).iter().map(|e| e.0 .0));
        let max = idx.first().map_or(0.0, |&i| row[i as usize]);
        let mut probs: Vec<f32> = idx.iter().map(|&i| (row[i as usize] - max).exp()).collect();
        let z: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= z);
        Level {
            tokens: idx.iter().map(|&i| to_target(i as usize)).collect(),
            probs,
        }
    }
}

/// Candidates a coupled level draws from the drafter's row before scoring them with the
/// target's noise (the best by the drafter's logit).
const COUPLED_POOL: usize = 64;

impl Level {
    /// The level for absolute position `pos` of a request that samples under the coupled rule:
    /// the row's best [`COUPLED_POOL`] tokens scored by [`Sampler::coupled`] (the drafter's
    /// log-probability plus the target's own Gumbel noise at `pos`), the best `k` kept and
    /// softmax-renormalised among themselves. Its first token is the drafter's coupled pick;
    /// its probabilities estimate which token the target will sample there.
    pub fn coupled(
        row: &[f32],
        k: usize,
        to_target: impl Fn(usize) -> TokenId,
        sampler: &Sampler,
        pos: usize,
    ) -> Level {
        let cand = crate::runtime::ops::top_k(row, COUPLED_POOL.max(k))
            .into_iter()
            .map(|(i, l)| (to_target(i.idx()), l))
            .collect();
        let mut scored = sampler.coupled(cand, pos);
        scored.truncate(k);
        let max = scored.first().map_or(0.0, |e| e.1);
        let mut probs: Vec<f32> = scored.iter().map(|e| (e.1 - max).exp()).collect();
        let z: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= z);
        Level {
            tokens: scored.into_iter().map(|e| e.0).collect(),
            probs,
        }
    }
}

/// A searched tree and, per node, the product of the drafter's probabilities along its path
/// (its own estimate that the target accepts the node; a sizing policy's input).
#[derive(Clone, Debug, Default)]
pub struct SearchedTree {
    pub tree: DraftTree,
    pub path_prob: Vec<f32>,
}

struct Cand {
    parent: Option<u32>,
    token: TokenId,
    score: f32,
    depth: u32,
    prob: f32,
    eos: bool,
}

/// The search's reusable state (one per drafter).
#[derive(Default)]
pub struct TreeSearch {
    cands: Vec<Cand>,
    ctx: Vec<TokenId>,
    ng: Vec<f32>,
    matched: Vec<u8>,
    /// This depth's ln(p̃ + ε) and stop flags, per candidate.
    ln_q: Vec<f32>,
    eos: Vec<bool>,
}

impl TreeSearch {
    /// Searches `levels` (depth 1 first) below the root, the last token of `committed`, and
    /// keeps the best `budget` nodes. `ngram` scores continuity after `committed ⧺ path`.
    pub fn search(
        &mut self,
        levels: &[Level],
        committed: &[TokenId],
        ngram: Option<&NgramTrie>,
        is_eos: impl Fn(TokenId) -> bool,
        budget: usize,
        p: &TreeSearchParams,
    ) -> Result<SearchedTree> {
        if p.beam == 0 || p.top_k == 0 {
            return Err(Error::BadRequest(
                "tree search needs beam and top-k ≥ 1".into(),
            ));
        }
        self.cands.clear();
        // The best `budget` nodes are prefix-closed and a child never outscores its parent, so
        // a beam wider than the budget expands nothing they need (but EOS parents, ranked last,
        // whose continuations never commit).
        let width = p.beam.min(budget.max(1));
        let mut beam: Vec<Option<u32>> = vec![None];
        let mut next: Vec<u32> = vec![];
        let ln = |x: f32| (x + p.eps).ln();
        for (l, level) in levels.iter().enumerate() {
            if budget == 0 {
                break;
            }
            let w_level = ((l + 1) as f32).powf(-p.level_exp);
            let w_logit = p.logit_decay.powi(l as i32);
            let use_ng = ngram.filter(|_| l > 0 || p.ngram_on_first);
            next.clear();
            self.ln_q.clear();
            self.ln_q.extend(level.probs.iter().map(|&q| ln(q)));
            self.eos.clear();
            self.eos.extend(level.tokens.iter().map(|&t| is_eos(t)));
            for &b in &beam {
                if let Some(trie) = use_ng {
                    self.context(b, committed, trie.order().saturating_sub(1));
                    self.ng.resize(level.tokens.len(), 0.0);
                    self.matched.resize(level.tokens.len(), 0);
                    trie.probs(&self.ctx, &level.tokens, &mut self.ng, &mut self.matched);
                }
                let (score, depth, prob) = b.map_or((0.0, 0, 1.0), |i| {
                    let c = &self.cands[i as usize];
                    (c.score, c.depth, c.prob)
                });
                for (i, (&t, &q)) in level.tokens.iter().zip(&level.probs).enumerate() {
                    let mut d = w_logit * self.ln_q[i];
                    if use_ng.is_some() {
                        d += p.ngram_weight * ln(self.ng[i]);
                    }
                    next.push(self.cands.len() as u32);
                    self.cands.push(Cand {
                        parent: b,
                        token: t,
                        score: score + (w_level * d).min(0.0),
                        depth: depth + 1,
                        prob: prob * q,
                        eos: self.eos[i],
                    });
                }
            }
            let c = &self.cands;
            let order = |a: &u32, b: &u32| {
                let (x, y) = (&c[*a as usize], &c[*b as usize]);
                x.eos
                    .cmp(&y.eos)
                    .then(y.score.total_cmp(&x.score))
                    .then(a.cmp(b))
            };
            if next.len() > width {
                next.select_nth_unstable_by(width - 1, order);
                next.truncate(width);
            }
            next.sort_by(order);
            beam.clear();
            beam.extend(next.iter().map(|&i| Some(i)));
        }
        self.cut(budget)
    }

    /// The last `n` tokens of `committed ⧺ path(b)` into `self.ctx`.
    fn context(&mut self, b: Option<u32>, committed: &[TokenId], n: usize) {
        self.ctx.clear();
        let mut at = b;
        while let (Some(i), true) = (at, self.ctx.len() < n) {
            let c = &self.cands[i as usize];
            self.ctx.push(c.token);
            at = c.parent;
        }
        let more = n - self.ctx.len();
        self.ctx.extend(committed.iter().rev().take(more).copied());
        self.ctx.reverse();
    }

    /// The best `budget` candidates as a tree, in score order (ties shallower first), so that
    /// parents come first and every prefix of the nodes is itself a tree.
    fn cut(&self, budget: usize) -> Result<SearchedTree> {
        let c = &self.cands;
        let mut order: Vec<u32> = (0..c.len() as u32).collect();
        let by_score = |a: &u32, b: &u32| {
            let (x, y) = (&c[*a as usize], &c[*b as usize]);
            y.score
                .total_cmp(&x.score)
                .then(x.depth.cmp(&y.depth))
                .then(a.cmp(b))
        };
        if budget > 0 && order.len() > budget {
            order.select_nth_unstable_by(budget - 1, by_score);
        }
        order.truncate(budget);
        order.sort_by(by_score);
        let mut id = vec![u32::MAX; c.len()];
        let mut out = SearchedTree::default();
        for &i in &order {
            let n = &c[i as usize];
            let parent = match n.parent {
                None => None,
                Some(p) if id[p as usize] != u32::MAX => Some(NodeId(id[p as usize])),
                Some(_) => {
                    return Err(Error::BadRequest(
                        "tree search kept a node without its parent".into(),
                    ))
                }
            };
            id[i as usize] = out.tree.push(parent, n.token, None)?.0;
            out.path_prob.push(n.prob);
        }
        Ok(out)
    }
}

/// Everything a drafter needs to turn its per-depth logits into a searched tree: the weights,
/// an optional n-gram trie, the stop tokens and reusable scratch. DFlash's block (the
/// DFlash-tree hybrid) and DART's slots both draft through it.
pub struct TreeDrafting {
    pub params: TreeSearchParams,
    pub ngram: Option<std::sync::Arc<NgramTrie>>,
    /// Tokens that end a sequence (ranked last in the beam).
    pub stop: Vec<TokenId>,
    search: TreeSearch,
    levels: Vec<Level>,
    idx: Vec<u32>,
}

impl TreeDrafting {
    pub fn new(
        params: TreeSearchParams,
        ngram: Option<std::sync::Arc<NgramTrie>>,
        stop: Vec<TokenId>,
    ) -> Self {
        TreeDrafting {
            params,
            ngram,
            stop,
            search: TreeSearch::default(),
            levels: vec![],
            idx: vec![],
        }
    }

    /// Another request's tree search: the same settings and trie, its own scratch.
    pub fn fork(&self) -> Self {
        Self::new(self.params.clone(), self.ngram.clone(), self.stop.clone())
    }

    /// `logits`: one row of `vocab` per depth (depth 1 first), over a vocabulary that
    /// `to_target` maps to target ids. `committed` ends with the root. `coupled`: the
    /// request's sampler and the absolute position of depth 1 when the request samples, so
    /// that each depth ranks its tokens by what the target will sample there
    /// ([`Level::coupled`]); `None` (or temperature 0): by the drafter's probabilities.
    pub fn draft(
        &mut self,
        logits: &[f32],
        vocab: usize,
        to_target: impl Fn(usize) -> TokenId,
        committed: &[TokenId],
        budget: usize,
        coupled: Option<(&Sampler, usize)>,
    ) -> Result<SearchedTree> {
        let depths = logits.len() / vocab.max(1);
        let coupled = coupled.filter(|(s, _)| !s.params.is_greedy());
        self.levels.clear();
        for d in 0..depths.min(budget) {
            let row = &logits[d * vocab..(d + 1) * vocab];
            let k = self.params.top_k;
            self.levels.push(match coupled {
                Some((s, first)) => Level::coupled(row, k, &to_target, s, first + d),
                None => Level::from_logits_in(row, k, &to_target, &mut self.idx),
            });
        }
        let stop = &self.stop;
        self.search.search(
            &self.levels,
            committed,
            self.ngram.as_deref(),
            |t| stop.contains(&t),
            budget,
            &self.params,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ngram::{TrieBuilder, TrieStamp};

    fn ids(v: &[u32]) -> Vec<TokenId> {
        v.iter().map(|&t| TokenId(t)).collect()
    }

    fn level(t: &[u32], p: &[f32]) -> Level {
        Level {
            tokens: ids(t),
            probs: p.to_vec(),
        }
    }

    #[test]
    fn from_logits_takes_top_k_and_renormalises() {
        let row = [0.0, 3.0, 1.0, 3.0, -2.0];
        let l = Level::from_logits(&row, 3, |i| TokenId(100 + i as u32));
        assert_eq!(l.tokens, ids(&[101, 103, 102]), "ties by lower id");
        let e = [1.0f32, 1.0, (-2.0f32).exp()];
        let z: f32 = e.iter().sum();
        for (a, b) in l.probs.iter().zip(e) {
            assert!((a - b / z).abs() < 1e-6);
        }
    }

    /// A coupled level leads with the drafter's Gumbel-coupled pick (the target's own sample
    /// when the drafter's logits are the target's), its probabilities renormalised; at
    /// temperature 0 the search falls back to the drafter's probabilities.
    #[test]
    fn coupled_levels_lead_with_the_targets_sample() {
        // A row no longer than the pool: every token is a candidate.
        let row: Vec<f32> = (0..60).map(|i| ((i * 37) % 101) as f32 * 0.05).collect();
        let to_target = |i: usize| TokenId(1000 + i as u32);
        let target: Vec<f32> = (0..1060)
            .map(|t| if t >= 1000 { row[t - 1000] } else { -1e9 })
            .collect();
        let s = Sampler::new(crate::sample::SamplingParams {
            temperature: 1.0,
            seed: 5,
            ..Default::default()
        })
        .unwrap();
        let mut firsts = std::collections::HashSet::new();
        for pos in 0..300 {
            let l = Level::coupled(&row, 25, to_target, &s, pos);
            assert_eq!(l.tokens.len(), 25);
            assert_eq!(l.tokens[0], s.sample_at(&target, pos), "pos {pos}");
            assert!((l.probs.iter().sum::<f32>() - 1.0).abs() < 1e-5);
            assert!(l.probs.windows(2).all(|w| w[0] >= w[1]));
            firsts.insert(l.tokens[0]);
        }
        assert!(
            firsts.len() > 10,
            "the pick follows the noise: {}",
            firsts.len()
        );
        // In a search: the tree's first node is depth 1's coupled pick.
        let mut td = TreeDrafting::new(TreeSearchParams::default(), None, vec![]);
        let rows: Vec<f32> = row.iter().chain(&row).copied().collect();
        for pos in 0..50 {
            let t = td
                .draft(&rows, 60, to_target, &ids(&[1]), 4, Some((&s, pos)))
                .unwrap();
            assert_eq!(t.tree.token(NodeId(0)), s.sample_at(&target, pos));
        }
        let greedy = Sampler::new(Default::default()).unwrap();
        let a = td.draft(&rows, 60, to_target, &ids(&[1]), 4, Some((&greedy, 7)));
        let b = td.draft(&rows, 60, to_target, &ids(&[1]), 4, None);
        assert_eq!(
            a.unwrap().tree.token(NodeId(0)),
            b.unwrap().tree.token(NodeId(0))
        );
    }

    /// The one-pass top-k equals a full sort (higher logit first, ties to the lower id), on
    /// rows with many ties.
    #[test]
    fn one_pass_top_k_equals_a_full_sort() {
        let mut x = 12345u64;
        for n in [1usize, 5, 25, 26, 300, 8192] {
            let row: Vec<f32> = (0..n)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((x >> 40) % 17) as f32 * 0.5
                })
                .collect();
            for k in [1, 3, 25] {
                let got = Level::from_logits(&row, k, |i| TokenId(i as u32)).tokens;
                let mut all: Vec<u32> = (0..n as u32).collect();
                all.sort_by(|a, b| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b)));
                all.truncate(k.min(n));
                assert_eq!(got, ids(&all), "n {n} k {k}");
            }
        }
    }

    /// Two depths, no n-gram: the scores worked by hand.
    #[test]
    fn scores_and_cut_by_hand() {
        let p = TreeSearchParams::default();
        let levels = [level(&[1, 2], &[0.6, 0.4]), level(&[3, 4], &[0.9, 0.1])];
        let mut s = TreeSearch::default();
        let out = s
            .search(&levels, &ids(&[7]), None, |_| false, 3, &p)
            .unwrap();
        // depth 1: ln .6 = −0.511, ln .4 = −0.916; depth 2 adds 2^−0.7 · 0.9 · ln q:
        // 0.9 → −0.0585, 0.1 → −1.2757. Best three: [1] −0.511, [1 3] −0.569, [2] −0.916.
        // Nodes come in score order (every prefix is a tree).
        let t = &out.tree;
        assert_eq!(t.len(), 3);
        assert_eq!(t.token(NodeId(0)), TokenId(1));
        assert_eq!(t.token(NodeId(1)), TokenId(3));
        assert_eq!(t.token(NodeId(2)), TokenId(2));
        assert_eq!(t.parent(NodeId(1)), Some(NodeId(0)));
        assert_eq!(t.parent(NodeId(2)), None);
        assert!((out.path_prob[1] - 0.54).abs() < 1e-6);
        assert!((out.path_prob[2] - 0.4).abs() < 1e-6);
        // the expected increments
        let w2 = 2f32.powf(-0.7) * 0.9;
        let c = &s.cands;
        assert!((c[2].score - (0.6f32 + 1e-10).ln() - w2 * (0.9f32 + 1e-10).ln()).abs() < 1e-6);
    }

    #[test]
    fn ngram_steers_deeper_levels_only() {
        // corpus: "5 1 3" often, "5 1 4" never; depth 2 prefers 4 by the drafter alone
        let mut b = TrieBuilder::new(3).unwrap();
        for _ in 0..3 {
            b.add_document(&ids(&[5, 1, 3, 9]));
        }
        let trie = b
            .finish(TrieStamp {
                vocab_size: 10,
                fingerprint: 0,
            })
            .unwrap();
        let levels = [level(&[2, 1], &[0.55, 0.45]), level(&[4, 3], &[0.6, 0.4])];
        let p = TreeSearchParams::default();
        let mut s = TreeSearch::default();
        let without = s
            .search(&levels, &ids(&[5]), None, |_| false, 3, &p)
            .unwrap();
        // [2] −0.598, [1] −0.799, [2 4] −0.881 (ahead of [1 4] −1.082 and [2 3] −1.105)
        let toks: Vec<_> = (0..3).map(|i| without.tree.token(NodeId(i)).0).collect();
        assert_eq!(toks, vec![2, 1, 4]);
        assert_eq!(without.tree.parent(NodeId(2)), Some(NodeId(0)));
        let with = s
            .search(&levels, &ids(&[5]), Some(&trie), |_| false, 3, &p)
            .unwrap();
        // depth 1 is not n-gram scored: [2] stays first. At depth 2 every continuation of
        // [2] is unseen (−11.5 · w), "1 3" after "5 1" has P = 1: [1 3] beats [2 4].
        let toks: Vec<_> = (0..3).map(|i| with.tree.token(NodeId(i)).0).collect();
        assert_eq!(toks, vec![2, 1, 3]);
        assert_eq!(with.tree.parent(NodeId(2)), Some(NodeId(1)));
    }

    /// A deterministic stream of numbers below `m`.
    fn lcg(seed: u64) -> impl FnMut(u32) -> u32 {
        let mut rng = seed;
        move |m| {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((rng >> 33) % m as u64) as u32
        }
    }

    /// A trie of `order` over `docs` random documents of `len` tokens below `symbols`.
    fn random_trie(
        next: &mut impl FnMut(u32) -> u32,
        order: usize,
        docs: usize,
        len: usize,
        symbols: u32,
    ) -> NgramTrie {
        let mut b = TrieBuilder::new(order).unwrap();
        for _ in 0..docs {
            let doc: Vec<u32> = (0..len).map(|_| next(symbols)).collect();
            b.add_document(&ids(&doc));
        }
        b.finish(TrieStamp {
            vocab_size: 32,
            fingerprint: 0,
        })
        .unwrap()
    }

    /// A search for the best `budget` nodes, whose beam is then no wider than the budget,
    /// keeps exactly the first `budget` nodes of a search for many more (random levels, no
    /// stop tokens, with and without an n-gram trie).
    #[test]
    fn a_narrow_beam_for_a_small_budget_keeps_the_same_nodes() {
        let mut next = lcg(11);
        let trie = random_trie(&mut next, 3, 30, 40, 30);
        let p = TreeSearchParams::default();
        let mut s = TreeSearch::default();
        for round in 0..40 {
            let levels: Vec<Level> = (0..6)
                .map(|_| {
                    let mut w: Vec<f32> = (0..30).map(|_| 1.0 + next(1000) as f32).collect();
                    let z: f32 = w.iter().sum();
                    w.iter_mut().for_each(|x| *x /= z);
                    let logits: Vec<f32> = w.iter().map(|x| x.ln()).collect();
                    Level::from_logits(&logits, p.top_k, |i| TokenId(i as u32))
                })
                .collect();
            let ng = (round % 2 == 0).then_some(&trie);
            let wide = s
                .search(&levels, &ids(&[3, 4]), ng, |_| false, 64, &p)
                .unwrap();
            for budget in [1, 3, 8, 12] {
                let narrow = s
                    .search(&levels, &ids(&[3, 4]), ng, |_| false, budget, &p)
                    .unwrap();
                assert_eq!(narrow.tree.len(), budget);
                for i in 0..budget as u32 {
                    let n = NodeId(i);
                    assert_eq!(narrow.tree.token(n), wide.tree.token(n), "round {round}");
                    assert_eq!(narrow.tree.parent(n), wide.tree.parent(n), "round {round}");
                }
                assert_eq!(narrow.path_prob[..], wide.path_prob[..budget]);
            }
        }
    }

    #[test]
    fn eos_goes_last_in_the_beam_and_ties_stay_prefix_closed() {
        // beam 1: depth 1 has EOS (9) as the likelier token; the beam follows 1 instead
        let p = TreeSearchParams {
            beam: 1,
            ..Default::default()
        };
        let levels = [level(&[9, 1], &[0.7, 0.3]), level(&[2, 3], &[0.5, 0.5])];
        let mut s = TreeSearch::default();
        let out = s
            .search(&levels, &ids(&[5]), None, |t| t.0 == 9, 10, &p)
            .unwrap();
        let t = &out.tree;
        assert_eq!(t.len(), 4, "[9], [1], [1 2], [1 3]");
        for i in 2..4 {
            assert_eq!(t.parent(NodeId(i)), Some(NodeId(1)));
        }
        // probability 1 everywhere: all increments 0, the cut keeps parents before children
        let levels = [
            level(&[1], &[1.0]),
            level(&[2], &[1.0]),
            level(&[3], &[1.0]),
        ];
        for budget in 0..4 {
            let out = s
                .search(&levels, &ids(&[5]), None, |_| false, budget, &p)
                .unwrap();
            assert_eq!(out.tree.len(), budget);
            assert!(out.tree.is_chain());
        }
    }
}
