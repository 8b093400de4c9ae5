//! One draft tree from every source's proposal: proposals are merged into a prefix tree, each
//! node priced by the acceptance actually observed for what proposed it (per source, the
//! source's match class, depth and score bucket), and the nodes put in order of their path's
//! estimated acceptance, so that any prefix is a tree and the sizer can cut it where nodes
//! stop paying on this machine.
//!
//! Those path estimates compound: a node takes the best of its sources' estimates, and
//! siblings from sources that disagree each keep the rate their source has overall, though at
//! most one of them can be accepted (on GSM8K the merged trees' estimates summed to 1.3× what
//! was accepted; with the model asked in every round, 1.4–1.5× in trees of four to six verified
//! nodes). So a second stage corrects each path estimate by what the verified nodes with
//! estimates in its tenth of [0, 1] turned out to be worth, kept apart for greedy and sampling
//! requests.
//!
//! A request that samples is verified by the coupled rule: a node is accepted when its token is
//! the target's Gumbel-max sample at its position, argmax over x of ln p(x) + G(x), and the
//! noise G is known before drafting. A token whose noise is high wins far more often than one
//! whose noise is low (with p(x) = 0.3: about 10 % at G(x) = 0, 73 % at G(x) = 2), so such
//! requests' nodes are also priced by their token's noise — but for a leading model's, whose
//! score already holds it (below).
//!
//! A model source's tree at T > 0 is that noise applied to the drafter's distribution: its
//! token at a node is argmax over x of ln q(x) + G(x), with the target's own G. Where it
//! differs from a lookup's token at the same parent, the lookup's wins only if the target
//! disagrees with the drafter there and picks that token: the same noise that made the model
//! rank it lower counts against it, so it is accepted less often than its source's rate says.
//! So at T > 0 such rival siblings are left out (with their subtrees) and the lookups keep what
//! agrees with the model or goes where it proposed nothing (deeper than its leaves, or where no
//! model ran). On a Zen 4 at T = 1, with the model asked every round, this drafted fewer nodes
//! per round on four of five bench sets for as many accepted tokens or more; its effect on the
//! clock was within the noise (docs/notebook.md, "The model leads at T > 0").

use crate::error::Result;
use crate::ngram::suffix::ContNode;
use crate::sample::{Noise, Sampler};
use crate::speculative::{DraftTree, NodeId, Outcome};
use std::collections::HashMap;

/// Deepest depth calibrated on its own (deeper nodes share its statistics).
const DEPTHS: u8 = 8;
/// Observations of one key kept (older ones fade by halving past it).
const MEMORY: f64 = 400.0;
/// Weight of the prior, in observations.
const PRIOR_WEIGHT: f64 = 2.0;
/// Buckets of a path estimate that the second stage corrects apart.
const PATH_BUCKETS: usize = 10;
/// Weight of the second stage's prior (no correction), in expected accepted nodes.
const PATH_PRIOR: f64 = 2.0;

/// One source's proposal: a tree of continuations (parents first), each node scored in [0, 1]
/// by the source (its share of the matches, its probability given its parent).
#[derive(Clone, Debug, Default)]
pub struct Proposal {
    /// The source's index (bit in [`Merged::sources`]).
    pub source: u8,
    /// The source's own confidence class (e.g. how long a match).
    pub class: u8,
    /// A model source's tree, whose tokens a sampling request's noise chose (see [`merge`]).
    pub lead: bool,
    pub nodes: Vec<ContNode>,
}

/// What a node's acceptance is calibrated by: its source, the source's class, its depth and
/// score bucket, and for a request that samples its token's noise (T > 0 accepts far less of
/// the same draft, and the noise decides much of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    source: u8,
    class: u8,
    depth: u8,
    bucket: u8,
    /// 0: a greedy request; 1–4: a sampling request's node, by its token's Gumbel noise
    /// (below 0, 0–1, 1–2, above 2: about 37, 32, 18 and 13 % of draws); 5: a sampling
    /// request's node from a leading model, whose score already holds that noise.
    noise: u8,
}

impl Key {
    /// `led`: the node comes from a leading (model) proposal.
    fn new(source: u8, class: u8, depth: usize, score: f32, noise: Option<f32>, led: bool) -> Key {
        let bucket = match score {
            s if s < 0.25 => 0,
            s if s < 0.5 => 1,
            s if s < 0.8 => 2,
            _ => 3,
        };
        let noise = match noise {
            Some(_) if led => 5,
            None => 0,
            Some(g) if g < 0.0 => 1,
            Some(g) if g < 1.0 => 2,
            Some(g) if g < 2.0 => 3,
            Some(_) => 4,
        };
        Key {
            source,
            class,
            depth: (depth.min(DEPTHS as usize)) as u8,
            bucket,
            noise,
        }
    }
}

/// The prior of a node scored `score` (in [0, 1]): 0.8 · score; for a sampling request's node
/// whose token has noise `g`, the chance that a token of that probability with that noise is
/// the target's Gumbel-max sample, exp(−(1 − s)/s · e^(−g)) (the rest of the vocabulary's
/// best ln p + G is Gumbel with location ln(1 − s)).
fn prior(score: f32, noise: Option<f32>) -> f32 {
    let s = 0.8 * score.clamp(0.0, 1.0);
    match noise {
        None => s,
        Some(g) => {
            let s = s.clamp(1e-3, 0.999);
            (-(1.0 - s) / s * (-g).exp()).exp()
        }
    }
}

/// Acceptance observed per [`Key`]: how often a node with that key was verified with its
/// parent accepted, and how often it was accepted; and per kind of request (greedy, sampling)
/// and bucket of path estimate, the verified nodes, their estimates summed and how many of
/// them were accepted.
#[derive(Clone, Debug, Default)]
pub struct Calibration {
    table: HashMap<Key, (f64, f64)>,
    paths: [[(f64, f64, f64); PATH_BUCKETS]; 2],
}

fn path_bucket(raw: f32) -> usize {
    ((raw.clamp(0.0, 1.0) * PATH_BUCKETS as f32) as usize).min(PATH_BUCKETS - 1)
}

impl Calibration {
    /// A path estimate `raw` of the first stage, corrected by the ratio of accepted nodes to
    /// estimated ones among the verified nodes of its bucket (`kind`: 0 greedy, 1 sampling).
    fn path_estimate(&self, kind: usize, raw: f32) -> f32 {
        let (_, sum, accepted) = self.paths[kind][path_bucket(raw)];
        let ratio = (accepted + PATH_PRIOR) / (sum + PATH_PRIOR);
        (raw as f64 * ratio).min(1.0) as f32
    }

    fn record_path(&mut self, kind: usize, raw: f32, accepted: bool) {
        let e = &mut self.paths[kind][path_bucket(raw)];
        e.0 += 1.0;
        e.1 += raw as f64;
        e.2 += accepted as u8 as f64;
        if e.0 > MEMORY {
            *e = (e.0 * 0.5, e.1 * 0.5, e.2 * 0.5);
        }
    }

    /// P(accepted | parent accepted) for a node of `key`: the observed rate, starting from
    /// `prior` ([`prior`]).
    pub fn estimate(&self, key: Key, prior: f32) -> f32 {
        let (tried, accepted) = self.table.get(&key).copied().unwrap_or_default();
        ((accepted + prior as f64 * PRIOR_WEIGHT) / (tried + PRIOR_WEIGHT)) as f32
    }

    fn record(&mut self, key: Key, accepted: bool) {
        let e = self.table.entry(key).or_default();
        e.0 += 1.0;
        e.1 += accepted as u8 as f64;
        if e.0 > MEMORY {
            e.0 *= 0.5;
            e.1 *= 0.5;
        }
    }
}

/// The merged tree with, per node, its path's estimated acceptance (corrected, and as the
/// first stage gave it), the keys it was priced by and which sources proposed it.
#[derive(Clone, Debug, Default)]
pub struct Merged {
    pub tree: DraftTree,
    pub conf: Vec<f32>,
    raw: Vec<f32>,
    /// 0: a greedy request's tree, 1: a sampling one's.
    kind: usize,
    pub keys: Vec<Vec<Key>>,
    pub sources: Vec<u32>,
}

struct Cand {
    parent: Option<usize>,
    token: crate::types::TokenId,
    depth: usize,
    cond: f32,
    keys: Vec<Key>,
    sources: u32,
}

/// Nodes whose path's estimated acceptance is below this are not kept.
const MIN_CONF: f32 = 0.02;

/// Merges `proposals` into one tree of at most `max_nodes` nodes, priced by `calib`: a node
/// proposed by several sources takes the best of their estimates; its path's estimate is the
/// product down from the root, corrected by the second stage (and never above its parent's).
/// `coupled`: for a request that samples, its sampler and the
/// root's absolute position (a node at depth d stands at root + d), so that nodes are priced
/// by their token's noise too; `None` for a greedy request.
pub fn merge(
    proposals: &[Proposal],
    calib: &Calibration,
    max_nodes: usize,
    coupled: Option<(&Sampler, usize)>,
) -> Result<Merged> {
    let coupled = coupled.filter(|(s, _)| !s.params.is_greedy());
    // At T > 0 the leading (model) proposals go first, and a lookup's token beside a leading
    // node of the same parent is left out with what hangs below it (see the module's note).
    let lead_first = coupled.is_some();
    let mut ordered: Vec<&Proposal> = proposals.iter().collect();
    if lead_first {
        ordered.sort_by_key(|p| !p.lead);
    }
    let mut led: Vec<Option<usize>> = Vec::new();
    let mut cands: Vec<Cand> = Vec::new();
    for p in ordered {
        let mut at: Vec<Option<usize>> = Vec::with_capacity(p.nodes.len());
        for n in &p.nodes {
            let parent = match n.parent {
                Some(j) if j < at.len() => match at[j] {
                    Some(q) => Some(q),
                    None => {
                        at.push(None);
                        continue;
                    }
                },
                Some(_) => break, // not parents-first: the rest is dropped
                None => None,
            };
            let found = cands
                .iter()
                .position(|c| c.parent == parent && c.token == n.token);
            if lead_first && found.is_none() && !p.lead && led.contains(&parent) {
                at.push(None);
                continue;
            }
            if lead_first && p.lead && !led.contains(&parent) {
                led.push(parent);
            }
            let depth = parent.map_or(1, |q| cands[q].depth + 1);
            let noise =
                coupled.map(|(s, root)| s.noise.key(root + depth, Noise::TOKEN).gumbel(n.token.0));
            let key = Key::new(p.source, p.class, depth, n.share, noise, p.lead);
            // A leading model ranked its tokens by ln q + G with the target's own noise: its
            // score is already the chance that the token is the target's sample, so the noise
            // is not counted again (twice, it reordered the model's siblings against its ranking).
            let est = calib.estimate(key, prior(n.share, noise.filter(|_| !p.lead)));
            let i = match found {
                Some(i) => i,
                None => {
                    cands.push(Cand {
                        parent,
                        token: n.token,
                        depth,
                        cond: 0.0,
                        keys: vec![],
                        sources: 0,
                    });
                    cands.len() - 1
                }
            };
            let c = &mut cands[i];
            c.cond = c.cond.max(est);
            c.keys.push(key);
            c.sources |= 1 << p.source;
            at.push(Some(i));
        }
    }
    // Parents precede children in `cands`, so one pass computes every path's estimate.
    let kind = coupled.is_some() as usize;
    let (mut raw, mut conf) = (vec![0f32; cands.len()], vec![0f32; cands.len()]);
    for i in 0..cands.len() {
        let parent = cands[i].parent;
        raw[i] = parent.map_or(1.0, |q| raw[q]) * cands[i].cond;
        let c = calib.path_estimate(kind, raw[i]);
        conf[i] = parent.map_or(c, |q| c.min(conf[q]));
    }
    let mut order: Vec<usize> = (0..cands.len()).filter(|&i| conf[i] >= MIN_CONF).collect();
    order.sort_by(|&a, &b| {
        conf[b]
            .total_cmp(&conf[a])
            .then(cands[a].depth.cmp(&cands[b].depth))
            .then(a.cmp(&b))
    });
    let mut out = Merged {
        kind,
        ..Default::default()
    };
    let mut id: Vec<Option<NodeId>> = vec![None; cands.len()];
    for i in order {
        if out.tree.len() >= max_nodes {
            break;
        }
        let parent = match cands[i].parent {
            Some(q) => match id[q] {
                Some(n) => Some(n),
                None => continue, // its parent was not kept
            },
            None => None,
        };
        id[i] = Some(out.tree.push(parent, cands[i].token, None)?);
        out.conf.push(conf[i]);
        out.raw.push(raw[i]);
        out.keys.push(std::mem::take(&mut cands[i].keys));
        out.sources.push(cands[i].sources);
    }
    Ok(out)
}

impl Merged {
    /// Learns from the verified part of this tree: every node verified with its parent
    /// accepted counts for its keys, accepted or not, and every verified node for the bucket
    /// of its path estimate. Returns, per source bit, the accepted nodes it had proposed.
    pub fn learn(&self, outcome: &Outcome, calib: &mut Calibration) -> Vec<(u32, bool)> {
        let verified = outcome.drafted.min(self.tree.len());
        let mut accepted = vec![false; self.tree.len()];
        for n in &outcome.accepted {
            if let Some(a) = accepted.get_mut(n.idx()) {
                *a = true;
            }
        }
        let mut seen = Vec::new();
        for i in 0..verified {
            calib.record_path(self.kind, self.raw[i], accepted[i]);
            let parent_ok = self
                .tree
                .parent(NodeId(i as u32))
                .is_none_or(|p| accepted[p.idx()]);
            if !parent_ok {
                continue;
            }
            for &k in &self.keys[i] {
                calib.record(k, accepted[i]);
            }
            seen.push((self.sources[i], accepted[i]));
        }
        seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::TokenId;

    fn node(parent: Option<usize>, t: u32, share: f32) -> ContNode {
        ContNode {
            parent,
            token: TokenId(t),
            share,
        }
    }

    /// A sampler at T = 1 with `seed`.
    fn t1(seed: u64) -> Sampler {
        Sampler::new(crate::sample::SamplingParams {
            temperature: 1.0,
            seed,
            ..Default::default()
        })
        .unwrap()
    }

    /// Shared prefixes merge; the order is by path estimate with parents first; a source whose
    /// nodes were always accepted rises above one whose nodes never were.
    #[test]
    fn merges_orders_and_learns() {
        let a = Proposal {
            lead: false,
            source: 0,
            class: 0,
            nodes: vec![
                node(None, 1, 1.0),
                node(Some(0), 2, 1.0),
                node(Some(1), 3, 1.0),
            ],
        };
        let b = Proposal {
            lead: false,
            source: 1,
            class: 0,
            nodes: vec![node(None, 1, 0.6), node(Some(0), 5, 0.9)],
        };
        let mut calib = Calibration::default();
        let m = merge(&[a.clone(), b.clone()], &calib, 16, None).unwrap();
        assert_eq!(m.tree.len(), 4, "token 1 is shared");
        assert_eq!(m.sources[0], 0b11);
        assert_eq!(m.tree.token(NodeId(0)), TokenId(1));
        assert!(m.conf.windows(2).all(|w| w[0] >= w[1]), "{:?}", m.conf);
        for i in 1..m.tree.len() {
            let p = m.tree.parent(NodeId(i as u32)).unwrap();
            assert!(p.idx() < i);
        }
        // Train: source 1's continuation (5) is always accepted, source 0's (2, 3) never.
        let five = (0..m.tree.len())
            .find(|&i| m.tree.token(NodeId(i as u32)) == TokenId(5))
            .unwrap();
        for _ in 0..50 {
            let out = Outcome {
                accepted: vec![NodeId(0), NodeId(five as u32)],
                tokens: vec![TokenId(1), TokenId(5)],
                bonus: TokenId(9),
                drafted: m.tree.len(),
                top: Default::default(),
            };
            m.learn(&out, &mut calib);
        }
        let m2 = merge(&[a.clone(), b.clone()], &calib, 16, None).unwrap();
        assert_eq!(m2.tree.token(NodeId(1)), TokenId(5), "{:?}", m2.conf);
        assert!(m2.conf[1] > 0.9);
        // The never-accepted child of an accepted parent falls near zero; its child, never
        // verified with its parent accepted, keeps its prior but goes with its parent.
        let toks: Vec<u32> = (0..m2.tree.len())
            .map(|i| m2.tree.token(NodeId(i as u32)).0)
            .collect();
        assert_eq!(toks, vec![1, 5, 2, 3]);
        assert!(
            m2.conf[2] < 0.05 && m2.conf[3] <= m2.conf[2],
            "{:?}",
            m2.conf
        );
        // A sampling request learns on its own: what greedy requests saw does not price its nodes.
        let t1 = t1(0);
        let hot = merge(&[a, b], &calib, 16, Some((&t1, 40))).unwrap();
        let fresh = merge(&hot_fresh(), &Calibration::default(), 16, Some((&t1, 40))).unwrap();
        assert_eq!(hot.conf[0], fresh.conf[0]);
        // Capped at max_nodes.
        assert_eq!(merge(&[], &calib, 4, None).unwrap().tree.len(), 0);
    }

    fn hot_fresh() -> Vec<Proposal> {
        vec![
            Proposal {
                lead: false,
                source: 0,
                class: 0,
                nodes: vec![
                    node(None, 1, 1.0),
                    node(Some(0), 2, 1.0),
                    node(Some(1), 3, 1.0),
                ],
            },
            Proposal {
                lead: false,
                source: 1,
                class: 0,
                nodes: vec![node(None, 1, 0.6), node(Some(0), 5, 0.9)],
            },
        ]
    }

    /// A sampling request's siblings of equal score are ordered by their tokens' noise at
    /// their position: the one more likely to be the target's sample comes first.
    #[test]
    fn a_sampling_request_prices_nodes_by_their_noise() {
        let t1 = t1(4);
        let p = Proposal {
            lead: false,
            source: 0,
            class: 0,
            nodes: vec![node(None, 1, 0.5), node(None, 2, 0.5)],
        };
        let calib = Calibration::default();
        let mut firsts = [0; 3];
        for root in 0..200 {
            let m = merge(std::slice::from_ref(&p), &calib, 8, Some((&t1, root))).unwrap();
            let key = t1.noise.key(root + 1, Noise::TOKEN);
            let best = if key.gumbel(1) > key.gumbel(2) { 1 } else { 2 };
            assert_eq!(m.tree.token(NodeId(0)), TokenId(best), "root {root}");
            // (A token whose noise leaves it almost no chance is not kept at all.)
            assert!(m.conf.len() == 1 || m.conf[0] > m.conf[1]);
            firsts[best as usize] += 1;
        }
        assert!(firsts[1] > 50 && firsts[2] > 50, "{firsts:?}");
        // A greedy request prices them alike.
        let m = merge(&[p], &calib, 8, None).unwrap();
        assert_eq!(m.conf[0], m.conf[1]);
    }

    /// A leading model's tokens were ranked by ln q + G with the target's own noise, so at T > 0
    /// its siblings keep its order (and price) whatever their noise: counting the noise again
    /// put a lower-ranked sibling first whenever its token's noise was high.
    #[test]
    fn a_leading_models_siblings_keep_its_order_at_t_above_0() {
        let t1 = t1(4);
        let model = Proposal {
            lead: true,
            source: 1,
            class: 0,
            nodes: vec![node(None, 1, 0.6), node(None, 2, 0.3)],
        };
        let calib = Calibration::default();
        for root in 0..200 {
            let m = merge(std::slice::from_ref(&model), &calib, 8, Some((&t1, root))).unwrap();
            assert_eq!(m.tree.token(NodeId(0)), TokenId(1), "root {root}");
            assert_eq!(m.conf.len(), 2, "root {root}");
            assert!(m.conf[0] > m.conf[1], "root {root}: {:?}", m.conf);
        }
        // Priced apart from lookups' sampled nodes and from greedy requests.
        let m = merge(std::slice::from_ref(&model), &calib, 8, Some((&t1, 0))).unwrap();
        assert!(m.keys[0].iter().all(|k| k.noise == 5));
        let g = merge(&[model], &calib, 8, None).unwrap();
        assert!(g.keys[0].iter().all(|k| k.noise == 0));
    }

    /// Two sources right half the time each, but together: where they agree (one node) it is
    /// accepted, where they disagree (two siblings) neither is. Each source's own rate is 1/2,
    /// so the first stage expects 1/2 accepted node where they agree and 1 where they do not,
    /// 3/4 a round against the 1/2 accepted; the second stage brings the estimate to what is
    /// accepted, and no node is estimated above its parent.
    /// At T > 0 a lookup's token beside the model's at the same parent is left out with its
    /// subtree; what agrees with the model, and what extends the model's leaves, stays. At
    /// T = 0 every proposal merges as before.
    #[test]
    fn the_model_leads_at_t_above_0() {
        let model = Proposal {
            lead: true,
            source: 1,
            class: 0,
            nodes: vec![node(None, 10, 1.0), node(Some(0), 11, 1.0)],
        };
        let lookup = Proposal {
            lead: false,
            source: 0,
            class: 0,
            nodes: vec![
                node(None, 10, 1.0),    // agrees
                node(Some(0), 12, 1.0), // beside the model's 11
                node(Some(1), 13, 1.0), // below that
                node(None, 20, 1.0),    // beside the model's 10
                node(Some(0), 11, 1.0), // agrees
                node(Some(4), 14, 1.0), // extends the model's leaf
            ],
        };
        let tokens = |m: &Merged| -> Vec<u32> {
            (0..m.tree.len())
                .map(|i| m.tree.token(NodeId(i as u32)).0)
                .collect()
        };
        let calib = Calibration::default();
        let props = [lookup.clone(), model.clone()];
        let greedy = merge(&props, &calib, 16, None).unwrap();
        let mut all = tokens(&greedy);
        all.sort();
        assert_eq!(all, vec![10, 11, 12, 13, 14, 20]);
        let t1 = t1(3);
        let mut extended = 0;
        for root in 0..64 {
            let m = merge(&props, &calib, 16, Some((&t1, root))).unwrap();
            let t = tokens(&m);
            assert!(
                t.iter().all(|x| [10, 11, 14].contains(x)),
                "root {root}: {t:?}"
            );
            if let Some(i) = t.iter().position(|&x| x == 10) {
                assert_eq!(m.sources[i], 0b11, "both sources proposed 10");
            }
            extended += t.contains(&14) as usize;
        }
        assert!(
            extended > 0,
            "the lookup's extension of the model's leaf stays"
        );
        // Without a model among the proposals nothing leads: the lookup's root siblings stay.
        let beside = (0..64)
            .filter(|&root| {
                let m = merge(std::slice::from_ref(&lookup), &calib, 16, Some((&t1, root)));
                tokens(&m.unwrap()).contains(&20)
            })
            .count();
        assert!(beside > 0);
    }

    #[test]
    fn path_estimates_are_corrected_by_what_was_accepted() {
        let one = |t: u32| Proposal {
            lead: false,
            source: 0,
            class: 0,
            nodes: vec![node(None, t, 1.0), node(Some(0), 9, 1.0)],
        };
        let other = |t: u32| Proposal {
            lead: false,
            source: 1,
            class: 0,
            nodes: vec![node(None, t, 1.0)],
        };
        let rounds = |calib: &Calibration| {
            [1u32, 2].map(|t| merge(&[one(1), other(t)], calib, 8, None).unwrap())
        };
        let mut calib = Calibration::default();
        for _ in 0..300 {
            for (agree, m) in rounds(&calib).into_iter().enumerate() {
                let agree = agree == 0;
                let out = Outcome {
                    accepted: if agree { vec![NodeId(0)] } else { vec![] },
                    tokens: vec![],
                    bonus: TokenId(7),
                    drafted: m.tree.len(),
                    top: Default::default(),
                };
                m.learn(&out, &mut calib);
            }
        }
        let [agree, disagree] = rounds(&calib);
        let sum = |m: &Merged| m.conf.iter().sum::<f32>();
        let raw = |m: &Merged| m.raw.iter().filter(|&&r| r >= MIN_CONF).sum::<f32>();
        assert!((raw(&agree) + raw(&disagree)) / 2.0 > 0.7);
        let expected = (sum(&agree) + sum(&disagree)) / 2.0;
        assert!((expected - 0.5).abs() < 0.08, "{expected}");
        for m in [&agree, &disagree] {
            for i in 0..m.tree.len() {
                if let Some(p) = m.tree.parent(NodeId(i as u32)) {
                    assert!(m.conf[i] <= m.conf[p.idx()], "{:?}", m.conf);
                }
            }
        }
    }

    /// A verified node whose parent was rejected teaches nothing.
    #[test]
    fn only_nodes_whose_parent_was_accepted_are_counted() {
        let a = Proposal {
            lead: false,
            source: 0,
            class: 0,
            nodes: vec![node(None, 1, 0.9), node(Some(0), 2, 0.9)],
        };
        let mut calib = Calibration::default();
        let m = merge(&[a], &calib, 8, None).unwrap();
        let out = Outcome {
            accepted: vec![],
            tokens: vec![],
            bonus: TokenId(7),
            drafted: 2,
            top: Default::default(),
        };
        let seen = m.learn(&out, &mut calib);
        assert_eq!(seen, vec![(1, false)]);
    }
}
