//! Hardware-aware draft sizing: pick the number of draft nodes that maximises expected committed
//! tokens per second, E[accepted + 1] / (c(n + 1) + draft cost(n)), from the target's measured
//! verify-cost curve c(rows) on this machine. Zero nodes (plain AR) is a candidate, so drafting
//! stops when it does not pay.
//!
//! Two estimates of E[accepted]: for chains, acceptance rates tracked online per depth
//! ([`Sizer::choose`], before drafting); for trees (DART §3.3 trees sized by the machine), the
//! drafter's own per-node path probabilities in score order — E[accepted] of the first n nodes
//! is κ · Σ p_i, with κ calibrating the drafter's confidence against what the target accepted
//! ([`Sizer::cut`], after drafting). A drafter opts in by reporting
//! [`crate::speculative::Drafter::node_confidence`].

use crate::error::Result;
use crate::kv::KvCache;
use crate::model::{Batch, Logits, Model, OutputSpec, Rows, Scratch};
use crate::speculative::{Drafter, Hidden};
use crate::types::{Pos, TokenId};
use std::time::Instant;

/// Verify cost in ms of a forward over `rows` rows, interpolated from measured points.
#[derive(Clone, Debug)]
pub struct CostCurve {
    /// (rows, ms), increasing in rows.
    pub points: Vec<(usize, f64)>,
}

impl CostCurve {
    /// Times forwards of 1, 2, 4, 8, 16, 32 rows (min of `repeats`) after `context` cached
    /// tokens. Costs a few hundred ms on a small model.
    pub fn measure(model: &Model, context: usize, repeats: usize) -> Result<CostCurve> {
        Self::measure_up_to(model, context, repeats, 32)
    }

    /// [`CostCurve::measure`] with forwards of 1, 2, 4, … up to `max_rows` rows (a batch's
    /// verify forwards are wider than one request's).
    pub fn measure_up_to(
        model: &Model,
        context: usize,
        repeats: usize,
        max_rows: usize,
    ) -> Result<CostCurve> {
        let max_rows = max_rows.max(2);
        let mut s = Scratch::default();
        let mut kv: KvCache = model.new_kv(context + max_rows + 8);
        let toks = synthetic_tokens(model, context.max(1) + max_rows);
        let pos = |a: usize, n: usize| (a..a + n).map(|p| Pos(p as u32)).collect::<Vec<_>>();
        prefill(model, &mut kv, &toks[..context.max(1)], &[], &mut s)?;
        let base = kv.len();
        let spec = OutputSpec {
            rows: Rows::All,
            logits: Logits::Argmax,
            taps: vec![],
        };
        let mut points = vec![];
        let sizes = std::iter::successors(Some(1usize), |&r| {
            (r < max_rows).then(|| (r * 2).min(max_rows))
        });
        for rows in sizes {
            let mut best = f64::INFINITY;
            for _ in 0..repeats.max(1) {
                let t = Instant::now();
                model.forward(
                    &mut kv,
                    &Batch {
                        tokens: &toks[base..base + rows],
                        positions: &pos(base, rows),
                        mask: None,
                    },
                    &spec,
                    &mut s,
                )?;
                best = best.min(t.elapsed().as_secs_f64() * 1e3);
                kv.truncate(base);
            }
            points.push((rows, best));
        }
        Ok(CostCurve { points })
    }

    /// A drafter's own cost curve: ms of one `propose` of up to n nodes (n = 1, 2, 4, 8 and
    /// `max_nodes`; min of `repeats`) after a `context`-token prompt whose states it was given.
    /// A parallel drafter's pass has a fixed part and a per-slot part, which a per-node rate
    /// cannot express.
    pub fn measure_drafter(
        target: &Model,
        drafter: &mut dyn Drafter,
        context: usize,
        max_nodes: usize,
        repeats: usize,
    ) -> Result<CostCurve> {
        let toks = synthetic_tokens(target, context.max(2));
        let n = toks.len() - 1;
        let mut kv: KvCache = target.new_kv(toks.len() + 1);
        let mut s = Scratch::default();
        let taps = drafter.taps().to_vec();
        let out = prefill(target, &mut kv, &toks[..n], &taps, &mut s)?;
        let width = taps.len() * target.config.hidden_size;
        drafter.begin(
            &toks[..n],
            Hidden {
                width,
                rows: &out.hidden,
            },
        )?;
        let mut sizes: Vec<usize> = [1, 2, 4, 8]
            .into_iter()
            .filter(|&k| k < max_nodes)
            .collect();
        sizes.push(max_nodes.max(1));
        let mut points = vec![];
        for k in sizes {
            let mut best = f64::INFINITY;
            for _ in 0..repeats.max(1) {
                let t = Instant::now();
                drafter.propose(&toks, k)?;
                best = best.min(t.elapsed().as_secs_f64() * 1e3);
            }
            points.push((k, best));
        }
        Ok(CostCurve { points })
    }

    pub fn ms(&self, rows: usize) -> f64 {
        let p = &self.points;
        if rows <= p[0].0 {
            return p[0].1;
        }
        for w in p.windows(2) {
            let ((r0, c0), (r1, c1)) = (w[0], w[1]);
            if rows <= r1 {
                return c0 + (c1 - c0) * (rows - r0) as f64 / (r1 - r0) as f64;
            }
        }
        let ((r0, c0), (r1, c1)) = (p[p.len() - 2], p[p.len() - 1]);
        c1 + (c1 - c0) / (r1 - r0) as f64 * (rows - r1) as f64
    }
}

/// `n` fixed, spread-out token ids for timing runs.
fn synthetic_tokens(model: &Model, n: usize) -> Vec<TokenId> {
    let vocab = model.config.vocab_size as u32;
    (0..n as u32)
        .map(|i| TokenId((i * 7919 + 11) % vocab))
        .collect()
}

/// Runs `toks` from position 0 into `kv` (no logits), returning the taps' outputs.
fn prefill<'s>(
    model: &Model,
    kv: &mut KvCache,
    toks: &[TokenId],
    taps: &[usize],
    s: &'s mut Scratch,
) -> Result<&'s crate::model::Output> {
    let pos: Vec<Pos> = (0..toks.len() as u32).map(Pos).collect();
    let spec = OutputSpec {
        rows: Rows::Last,
        logits: Logits::None,
        taps: taps.to_vec(),
    };
    let b = Batch {
        tokens: toks,
        positions: &pos,
        mask: None,
    };
    model.forward(kv, &b, &spec, s)
}

/// Online acceptance statistics and the draft-size choice.
#[derive(Clone, Debug)]
pub struct Sizer {
    pub curve: CostCurve,
    /// Per depth (1-based index d-1): drafts tried at depth d with depth d-1 accepted, and accepted.
    tried: Vec<f64>,
    accepted: Vec<f64>,
    /// Drafting ms per proposed node (exponential moving average).
    draft_ms_per_node: f64,
    /// The drafter's measured cost of a proposal of n nodes, when known (instead of the
    /// per-node average).
    draft_curve: Option<CostCurve>,
    /// Forgetting factor for the statistics (1 = never forget).
    decay: f64,
    /// Tree sizing: accepted nodes and the drafter's predicted acceptance (Σ path
    /// probabilities) of the nodes verified, decayed.
    tree_accepted: f64,
    tree_predicted: f64,
    /// Tree sizing: EMA of each tree round's speed relative to AR (tokens per ms over AR's).
    tree_gain: f64,
    /// Tree rounds, recent average: (accepted nodes, verified nodes, drafting ms).
    tree_recent: (f64, f64, f64),
    /// The cost model checked against the clock.
    guard: SpeedGuard,
    /// DiffuSpec's adaptive draft length instead of the cost model (chains).
    adl: Option<crate::speculative::cps::Adl>,
    /// Why the last [`Sizer::budget`] was 0 (`None`: it was not).
    undrafted: Option<Undrafted>,
}

/// Why a sized round drafted nothing (reported in its [`crate::speculative::RoundStats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Undrafted {
    /// The speed guard holds drafting off: drafting measured slower than AR on this machine.
    SpeedGuard,
    /// One round in `probe_every` runs without a draft so that AR's speed stays measured.
    Probe,
    /// The cost model found no draft worth its verify rows here (c(k) against acceptance).
    CostModel,
}

/// How many rounds of a run drafted nothing, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct UndraftedCounts {
    pub speed_guard: usize,
    pub probe: usize,
    pub cost_model: usize,
}

impl UndraftedCounts {
    pub fn of(reasons: impl IntoIterator<Item = Option<Undrafted>>) -> Self {
        let mut c = UndraftedCounts::default();
        for r in reasons.into_iter().flatten() {
            match r {
                Undrafted::SpeedGuard => c.speed_guard += 1,
                Undrafted::Probe => c.probe += 1,
                Undrafted::CostModel => c.cost_model += 1,
            }
        }
        c
    }

    pub fn total(&self) -> usize {
        self.speed_guard + self.probe + self.cost_model
    }

    /// One line for people: why rounds went undrafted, with this machine's verify cost
    /// `c(k)/c(1)` for k = 8 and 16 when a cost curve is known.
    pub fn explain(&self, rounds: usize, curve: Option<&CostCurve>) -> String {
        if self.total() == 0 {
            return String::new();
        }
        let mut why = vec![];
        if self.speed_guard > 0 {
            why.push(format!(
                "{} held off by the speed guard (drafting measured slower than AR)",
                self.speed_guard
            ));
        }
        if self.cost_model > 0 {
            why.push(format!(
                "{} where no draft was worth its verify rows",
                self.cost_model
            ));
        }
        if self.probe > 0 {
            why.push(format!("{} AR probes", self.probe));
        }
        let cost = curve
            .map(|c| {
                let c1 = c.ms(1).max(1e-9);
                format!(
                    "; verifying 8 rows costs {:.1}, 16 rows {:.1} decode steps here",
                    c.ms(8) / c1,
                    c.ms(16) / c1
                )
            })
            .unwrap_or_default();
        format!(
            "drafting off in {} of {rounds} rounds: {}{cost}",
            self.total(),
            why.join(", ")
        )
    }
}

/// Committed tokens and wall-clock ms of recent rounds (decayed sums).
#[derive(Clone, Copy, Debug, Default)]
struct Rate {
    tokens: f64,
    ms: f64,
    n: u32,
}

impl Rate {
    fn add(&mut self, tokens: f64, ms: f64) {
        self.tokens = 0.9 * self.tokens + tokens;
        self.ms = 0.9 * self.ms + ms;
        self.n += 1;
    }
    fn per_ms(&self) -> f64 {
        self.tokens / self.ms.max(1e-9)
    }
}

/// The cost model checked against the clock: the measured committed tokens per ms of the rounds
/// that drafted and of those that did not (each round timed from its draft to its commit, the
/// target's forward included). When drafting measures slower than AR by more than `margin`,
/// nothing is drafted for `hold` rounds (then drafting is measured afresh); while drafting, one
/// round in `probe_every` runs without a draft so that AR's speed stays measured. Whatever the
/// cost model misses on this machine (per-round overheads, a drafter's passes it undercounts),
/// speculation then costs at most its probes when it does not pay.
#[derive(Clone, Debug)]
pub struct SpeedGuard {
    draft: Rate,
    ar: Rate,
    round: u64,
    off_until: u64,
    pub probe_every: u64,
    pub hold: u64,
    pub margin: f64,
}

impl Default for SpeedGuard {
    fn default() -> Self {
        SpeedGuard {
            draft: Rate::default(),
            ar: Rate::default(),
            round: 0,
            off_until: 0,
            probe_every: 16,
            hold: 64,
            margin: 0.02,
        }
    }
}

impl SpeedGuard {
    /// Whether this round may draft (counts the round).
    pub fn allows_draft(&mut self) -> bool {
        self.why_not().is_none()
    }

    /// Counts the round; why it may not draft, if it may not.
    pub fn why_not(&mut self) -> Option<Undrafted> {
        self.round += 1;
        if self.round < self.off_until {
            Some(Undrafted::SpeedGuard)
        } else if self.round.is_multiple_of(self.probe_every) {
            Some(Undrafted::Probe)
        } else {
            None
        }
    }

    /// A round committed `tokens` in `ms`, with or without verified draft nodes.
    pub fn observe(&mut self, tokens: usize, ms: f64, drafted: bool) {
        if !(ms.is_finite() && ms > 0.0) {
            return;
        }
        if drafted {
            self.draft.add(tokens as f64, ms);
        } else {
            self.ar.add(tokens as f64, ms);
        }
        if self.draft.n >= 8
            && self.ar.n >= 3
            && self.draft.per_ms() < self.ar.per_ms() * (1.0 - self.margin)
        {
            self.off_until = self.round + self.hold;
            self.draft = Rate::default();
        }
    }
}

/// The batch a session's round is verified in: how many sessions decode in it (this one
/// included) and how many prompt rows are prefilled in the same forward. `BatchShape::default()`
/// is a session alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchShape {
    pub streams: usize,
    pub prefill: usize,
}

impl Sizer {
    pub fn new(curve: CostCurve) -> Self {
        Sizer {
            curve,
            tried: vec![],
            accepted: vec![],
            draft_ms_per_node: 0.0,
            draft_curve: None,
            decay: 0.98,
            tree_accepted: 0.0,
            tree_predicted: 0.0,
            tree_gain: 1.0,
            tree_recent: (0.0, 0.0, 0.0),
            guard: SpeedGuard::default(),
            adl: None,
            undrafted: None,
        }
    }

    /// Sizes chains by DiffuSpec's adaptive draft length (§4.5) instead of the cost model; the
    /// speed guard stays out of it (the paper's policy as it is).
    pub fn with_adl(mut self, p: crate::speculative::cps::AdlParams) -> Self {
        self.adl = Some(crate::speculative::cps::Adl::new(p));
        self
    }

    /// Prices proposals with the drafter's measured cost curve
    /// ([`CostCurve::measure_drafter`]).
    pub fn with_draft_curve(mut self, c: Option<CostCurve>) -> Self {
        self.draft_curve = c;
        self
    }

    /// This round's budget, before drafting: nothing while the speed guard holds drafting off
    /// (cost-model sizing only), else the tree policy's ([`Sizer::choose_tree`]) or the chain
    /// policy's ([`Sizer::choose`]: ADL's length or the cost model's choice).
    pub fn budget(&mut self, max: usize, b: BatchShape, trees: bool) -> usize {
        self.undrafted = None;
        if self.adl.is_none() {
            if let Some(why) = self.guard.why_not() {
                self.undrafted = Some(why);
                return 0;
            }
        }
        let n = if trees {
            self.choose_tree(max, b)
        } else {
            self.choose(max, b)
        };
        if n == 0 && max > 0 {
            self.undrafted = Some(Undrafted::CostModel);
        }
        n
    }

    /// Why the last budget was 0 (`None` when it was not).
    pub fn undrafted(&self) -> Option<Undrafted> {
        self.undrafted
    }

    /// After a round that committed `tokens` in `ms` (draft to commit), with or without verified
    /// draft nodes, `accepted` of them accepted: ADL's update (`eos`: the 1-based depth of the
    /// draft's first stop token), or the speed guard's.
    pub fn record_round(
        &mut self,
        tokens: usize,
        ms: f64,
        drafted: bool,
        accepted: usize,
        eos: impl FnOnce() -> Option<usize>,
    ) {
        match &mut self.adl {
            Some(a) if drafted => a.observe(eos(), accepted),
            Some(_) => {}
            None => self.guard.observe(tokens, ms, drafted),
        }
    }

    /// Expected ms of drafting n nodes.
    pub fn draft_ms(&self, n: usize) -> f64 {
        match (&self.draft_curve, n) {
            (_, 0) => 0.0,
            (Some(c), n) => c.ms(n),
            (None, n) => self.draft_ms_per_node * n as f64,
        }
    }

    /// Acceptance rate at depth d (≥ 1) given depth d−1 accepted, with a Beta(1, 1) prior.
    pub fn rate(&self, d: usize) -> f64 {
        let i = d - 1;
        let (a, t) = (
            self.accepted.get(i).copied().unwrap_or(0.0),
            self.tried.get(i).copied().unwrap_or(0.0),
        );
        (a + 1.0) / (t + 2.0)
    }

    /// Expected committed tokens of a chain of n drafts: 1 + Σ_i Π_{j≤i} rate(j).
    pub fn expected_tokens(&self, n: usize) -> f64 {
        let (mut e, mut run) = (1.0, 1.0);
        for d in 1..=n {
            run *= self.rate(d);
            e += run;
        }
        e
    }

    /// This session's share of a step's verify cost when every one of the batch's `streams`
    /// decoding sessions verifies `rows` rows, next to `prefill` prompt rows: c(prefill +
    /// streams · rows) / streams. Alone (1 stream, no prefill) it is c(rows).
    fn share_ms(&self, rows: usize, b: BatchShape) -> f64 {
        let n = b.streams.max(1);
        self.curve.ms(b.prefill + n * rows) / n as f64
    }

    /// The draft size in 0..=max with the best expected tokens per ms. In a batch, every
    /// session is assumed to draft alike: the step costs c(prefill + B(n + 1)) plus B drafts
    /// and commits B · E[n] tokens, so as the batch grows (the forward turns compute-bound and
    /// each draft runs on its own) the best size shrinks to 0.
    pub fn choose(&self, max: usize, b: BatchShape) -> usize {
        if let Some(a) = &self.adl {
            return a.k().min(max);
        }
        let score =
            |n: usize| self.expected_tokens(n) / (self.share_ms(n + 1, b) + self.draft_ms(n));
        (0..=max)
            .max_by(|&a, &c| score(a).total_cmp(&score(c)).then(c.cmp(&a)))
            .unwrap_or(0)
    }

    /// The calibration κ of the drafter's path probabilities (accepted / predicted, with a
    /// prior of one node each).
    pub fn calibration(&self) -> f64 {
        (self.tree_accepted + 1.0) / (self.tree_predicted + 1.0)
    }

    /// Tree sizing, before drafting: the full `max` while trees have paid recently (their
    /// size is cut after drafting), none when they have not (AR rounds then drift the
    /// estimate back so trees are retried). In a batch, a tree is drafted only if a recent
    /// tree round (its nodes, accepted tokens and drafting ms, averaged) would beat no draft
    /// with every session of the batch doing the same.
    pub fn choose_tree(&self, max: usize, b: BatchShape) -> usize {
        if b.streams > 1 || b.prefill > 0 {
            let (acc, nodes, dms) = self.tree_recent;
            if nodes > 0.0 {
                let with = (1.0 + acc) / (self.share_ms(nodes.round() as usize + 1, b) + dms);
                let without = 1.0 / self.share_ms(1, b);
                if with <= without {
                    return 0;
                }
            }
        }
        if self.tree_gain >= 1.0 {
            max
        } else {
            0
        }
    }

    /// Tree sizing, after drafting: how many of the tree's nodes (in score order, so any prefix
    /// is a tree) to verify, given each node's path probability `conf` and the ms already spent
    /// drafting: argmax over n of (1 + κ Σ_{i<n} conf_i) / (share of c(n + 1) + draft_ms), the
    /// share as in [`Sizer::choose`].
    pub fn cut(&self, conf: &[f32], draft_ms: f64, b: BatchShape) -> usize {
        let k = self.calibration();
        let mut e = 1.0;
        let (mut best, mut best_score) = (0, e / (self.share_ms(1, b) + draft_ms));
        for (i, &p) in conf.iter().enumerate() {
            e += k * p as f64;
            let score = e / (self.share_ms(i + 2, b) + draft_ms);
            if score > best_score {
                (best, best_score) = (i + 1, score);
            }
        }
        best
    }

    /// Records a tree round: `nodes` verified, the sum of their path probabilities
    /// (`predicted`), how many were accepted, and the round's drafting ms (`nodes` 0: an AR
    /// round).
    pub fn observe_tree(&mut self, nodes: usize, predicted: f64, accepted: usize, draft_ms: f64) {
        if nodes == 0 {
            self.tree_gain = 0.95 * self.tree_gain + 0.05 * 1.02;
            return;
        }
        let r = &mut self.tree_recent;
        let w = if r.1 == 0.0 { 1.0 } else { 0.2 };
        *r = (
            (1.0 - w) * r.0 + w * accepted as f64,
            (1.0 - w) * r.1 + w * nodes as f64,
            (1.0 - w) * r.2 + w * draft_ms,
        );
        self.tree_accepted = self.decay * self.tree_accepted + accepted as f64;
        self.tree_predicted = self.decay * self.tree_predicted + predicted;
        let ar = self.curve.ms(1);
        let gain = (accepted as f64 + 1.0) * ar / (self.curve.ms(nodes + 1) + draft_ms);
        self.tree_gain = 0.9 * self.tree_gain + 0.1 * gain;
    }

    /// Records a round: `drafted_depth` = deepest proposed depth, `accepted` = accepted length.
    /// Rounds without drafts still decay the statistics towards the prior, so a drafter that
    /// was switched off is tried again after a while.
    pub fn observe(
        &mut self,
        drafted_depth: usize,
        accepted: usize,
        draft_ms: f64,
        drafted_nodes: usize,
    ) {
        if self.tried.len() < drafted_depth {
            self.tried.resize(drafted_depth, 0.0);
            self.accepted.resize(drafted_depth, 0.0);
        }
        for v in self.tried.iter_mut().chain(self.accepted.iter_mut()) {
            *v *= self.decay;
        }
        for d in 1..=drafted_depth.min(accepted + 1) {
            self.tried[d - 1] += 1.0;
            if d <= accepted {
                self.accepted[d - 1] += 1.0;
            }
        }
        if drafted_nodes > 0 {
            let per = draft_ms / drafted_nodes as f64;
            self.draft_ms_per_node = 0.8 * self.draft_ms_per_node + 0.2 * per;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve() -> CostCurve {
        CostCurve {
            points: vec![
                (1, 5.0),
                (2, 5.5),
                (4, 6.5),
                (8, 9.0),
                (16, 15.0),
                (32, 30.0),
            ],
        }
    }

    /// A pass with a large fixed part: the measured curve makes one long draft worth it where
    /// the per-node average of short drafts would not.
    #[test]
    fn a_draft_cost_curve_prices_proposals() {
        let mut s = Sizer::new(curve());
        for _ in 0..50 {
            s.observe(8, 8, 4.0, 8);
        }
        // 50 rounds of 0.5 ms per node, averaged with weight 0.2 from 0: 0.5 · (1 − 0.8⁵⁰).
        let ema = 0.5 * (1.0 - 0.8f64.powi(50));
        assert!((s.draft_ms(8) - 8.0 * ema).abs() < 1e-12);
        let flat = CostCurve {
            points: vec![(1, 1.5), (8, 1.6), (15, 1.7)],
        };
        let s = s.with_draft_curve(Some(flat));
        assert_eq!(s.draft_ms(0), 0.0);
        assert!((s.draft_ms(15) - 1.7).abs() < 1e-9);
        assert!(
            s.choose(15, BatchShape::default()) >= 8,
            "cheap long drafts are chosen: {}",
            s.choose(15, BatchShape::default())
        );
    }

    /// The cut keeps nodes while their calibrated acceptance pays for their verify rows, and
    /// the calibration follows what the target accepted.
    #[test]
    fn trees_are_cut_where_nodes_stop_paying() {
        let mut s = Sizer::new(curve());
        // Verify rows cost 0.25-1 ms each beyond the first; nodes of probability 0.9 pay,
        // those of 0.01 do not.
        let conf = [0.9, 0.8, 0.7, 0.5, 0.3, 0.05, 0.02, 0.01, 0.01, 0.01];
        let n = s.cut(&conf, 1.0, BatchShape::default());
        assert!((3..=6).contains(&n), "cut {n}");
        assert_eq!(
            s.cut(&[0.01, 0.01], 1.0, BatchShape::default()),
            0,
            "hopeless nodes are not verified"
        );
        // A drafter that is twice as confident as it should be gets a smaller tree.
        let sum = |c: &[f32]| c.iter().map(|&p| p as f64).sum::<f64>();
        for _ in 0..100 {
            s.observe_tree(5, sum(&conf[..5]), 1, 1.0);
        }
        assert!(
            (s.calibration() - 1.0 / 3.2).abs() < 0.05,
            "{}",
            s.calibration()
        );
        assert!(s.cut(&conf, 1.0, BatchShape::default()) < n);
        // Trees that do not pay switch drafting off; AR rounds bring it back.
        // One of five nodes accepted, 1 ms drafting: (1 + 1) · 5 / (c(6) + 1) ≈ 1.14 × AR.
        assert_eq!(
            s.choose_tree(32, BatchShape::default()),
            32,
            "gain {}",
            s.tree_gain
        );
        for _ in 0..100 {
            s.observe_tree(8, sum(&conf[..8]), 0, 20.0);
        }
        assert_eq!(s.choose_tree(32, BatchShape::default()), 0);
        let back = (0..500).find(|_| {
            s.observe_tree(0, 0.0, 0, 0.0);
            s.choose_tree(32, BatchShape::default()) > 0
        });
        assert!(back.is_some());
    }

    /// A forward that turns compute-bound (this machine's shape: c(16) ≈ 3 c(1), then linear):
    /// alone a good drafter drafts long; in a batch of 64 streams the verify rows cost about
    /// what the tokens they add are worth, so drafting stops, for chains and for trees.
    #[test]
    fn drafting_shrinks_and_stops_as_the_batch_grows() {
        let bound = CostCurve {
            points: vec![
                (1, 4.2),
                (4, 5.5),
                (16, 12.0),
                (64, 42.0),
                (256, 168.0),
                (1024, 672.0),
            ],
        };
        let draft = CostCurve {
            points: vec![(1, 1.0), (8, 1.2), (15, 1.4)],
        };
        let mut s = Sizer::new(bound).with_draft_curve(Some(draft));
        for _ in 0..200 {
            s.observe(8, 5, 1.2, 8); // 5 of 8 accepted each round
        }
        let sizes: Vec<usize> = [1, 4, 16, 64]
            .iter()
            .map(|&b| {
                s.choose(
                    15,
                    BatchShape {
                        streams: b,
                        prefill: 0,
                    },
                )
            })
            .collect();
        assert!(sizes[0] >= 4, "{sizes:?}");
        assert!(sizes.windows(2).all(|w| w[1] <= w[0]), "{sizes:?}");
        assert_eq!(sizes[3], 0, "{sizes:?}");
        // Trees: 5 of 16 nodes accepted, 1 ms drafting, recently (1.9 × AR alone).
        for _ in 0..50 {
            s.observe_tree(16, 5.0, 5, 1.0);
        }
        assert_eq!(s.choose_tree(32, BatchShape::default()), 32);
        let big = BatchShape {
            streams: 64,
            prefill: 0,
        };
        assert_eq!(s.choose_tree(32, big), 0);
    }

    /// Drafting that measures slower than AR is switched off for a while and measured afresh
    /// after; drafting that pays stays on, with one AR probe round in 16.
    #[test]
    fn the_guard_switches_off_drafting_that_measures_slower_than_ar() {
        let mut g = SpeedGuard::default();
        // AR: 1 token in 4 ms; drafting: 1.1 tokens in 5 ms (0.22 vs 0.25 tokens per ms).
        let mut drafted = 0;
        for _ in 0..1000 {
            if g.allows_draft() {
                drafted += 1;
                g.observe(1, 4.0 * 1.25 / 1.1, true);
            } else {
                g.observe(1, 4.0, false);
            }
        }
        // 45 rounds before AR is measured three times, then 8 of every ~71 rounds.
        assert!(drafted < 200, "{drafted} of 1000 rounds drafted");
        // Drafting 1.5× faster: every round but the probes.
        let mut g = SpeedGuard::default();
        let mut drafted = 0;
        for _ in 0..1000 {
            if g.allows_draft() {
                drafted += 1;
                g.observe(3, 8.0, true);
            } else {
                g.observe(1, 4.0, false);
            }
        }
        assert_eq!(drafted, 1000 - 1000 / 16);
        assert!(g.round >= g.off_until, "drafting is on");
    }

    /// A sized round that drafts nothing says why: the guard's hold, its AR probe, or the
    /// cost model; the counts and the line for people follow.
    #[test]
    fn undrafted_rounds_say_why() {
        let b = BatchShape::default();
        // Nothing is ever accepted and drafts are expensive: the cost model drafts nothing.
        let mut s = Sizer::new(curve());
        for _ in 0..200 {
            s.observe(8, 0, 40.0, 8);
        }
        let mut reasons = vec![];
        for _ in 0..32 {
            let n = s.budget(12, b, false);
            assert_eq!(n == 0, s.undrafted().is_some());
            reasons.push(s.undrafted());
        }
        let c = UndraftedCounts::of(reasons.iter().copied());
        assert_eq!((c.probe, c.speed_guard, c.cost_model), (2, 0, 30));
        // The guard holding drafting off.
        let mut s = Sizer::new(curve());
        s.guard.off_until = 100;
        assert_eq!(s.budget(12, b, false), 0);
        assert_eq!(s.undrafted(), Some(Undrafted::SpeedGuard));
        let line = UndraftedCounts::of([Some(Undrafted::SpeedGuard), None, Some(Undrafted::Probe)])
            .explain(3, Some(&curve()));
        assert!(line.starts_with("drafting off in 2 of 3 rounds"), "{line}");
        assert!(
            line.contains("speed guard") && line.contains("1 AR probes"),
            "{line}"
        );
        assert!(line.contains("verifying 8 rows costs"), "{line}");
        assert_eq!(UndraftedCounts::default().explain(5, None), "");
    }

    /// With ADL the size is ADL's (capped by the round's most), whatever the costs say.
    #[test]
    fn adl_sizes_chains_instead_of_the_cost_model() {
        let mut s = Sizer::new(curve()).with_adl(crate::speculative::cps::AdlParams::for_block(12));
        for _ in 0..200 {
            s.observe(8, 0, 40.0, 8); // nothing accepted, expensive: the cost model says 0
        }
        assert_eq!(s.choose(12, BatchShape::default()), 12);
        assert_eq!(s.choose(5, BatchShape::default()), 5);
        for _ in 0..10 {
            s.record_round(1, 4.0, true, 0, || Some(2));
        }
        assert_eq!(
            s.choose(12, BatchShape::default()),
            8,
            "ADL's floor, ⌈2/3 · 12⌉"
        );
    }

    #[test]
    fn interpolates_and_extrapolates() {
        let c = curve();
        assert_eq!(c.ms(1), 5.0);
        assert!((c.ms(3) - 6.0).abs() < 1e-9);
        assert!((c.ms(12) - 12.0).abs() < 1e-9);
        assert!((c.ms(48) - 45.0).abs() < 1e-9);
    }

    #[test]
    fn drafts_more_when_acceptance_is_high_and_nothing_when_it_is_zero() {
        let mut s = Sizer::new(curve());
        for _ in 0..200 {
            s.observe(8, 8, 0.1, 8);
        }
        let long = s.choose(16, BatchShape::default());
        assert!(long >= 8, "{long}");
        let mut s = Sizer::new(curve());
        for _ in 0..200 {
            s.observe(8, 0, 0.1, 8);
        }
        assert_eq!(s.choose(16, BatchShape::default()), 0);
        // Rounds without drafts forget the bad statistics, so drafting is retried eventually.
        let rounds = (0..2000).find(|_| {
            s.observe(0, 0, 0.0, 0);
            s.choose(16, BatchShape::default()) > 0
        });
        assert!(rounds.is_some());
        // Expensive drafting also stops it.
        let mut s = Sizer::new(curve());
        for _ in 0..200 {
            s.observe(4, 2, 40.0, 4);
        }
        assert_eq!(s.choose(16, BatchShape::default()), 0);
    }
}
