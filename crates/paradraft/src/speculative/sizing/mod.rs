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

mod cost;
mod depths;
mod guard;

pub use cost::{CostCurve, LearnedCost, SavedCosts, WARM_FORWARDS};
pub use depths::DepthRates;
pub use guard::{GuardMemory, SpeedGuard, Undrafted, UndraftedCounts};

/// Writes `value` as JSON to `file`, whole or not at all (a temporary file renamed), creating
/// its directory: what the sizer keeps between processes (guards, cost curves) is a cache, so
/// a failure only costs the next process its memory.
fn keep_json(file: &std::path::Path, value: &impl serde::Serialize) {
    let write = || -> std::io::Result<()> {
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = file.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, serde_json::to_vec(value)?)?;
        std::fs::rename(&tmp, file)
    };
    let _ = write();
}

/// Forgetting factor of the acceptance statistics, per round (1 = never forget).
const DECAY: f64 = 0.98;

/// Nodes beyond twice the recent cuts' size that a costly tree proposal is asked for.
const TREE_ROOM: usize = 4;

/// The largest tree [`Sizer::a_tree_can_pay`] weighs.
const BOUND_NODES: usize = 16;

/// Tree rounds in a row cut to nothing after which the next proposals are skipped: 2 rounds,
/// then twice as many after each further empty cut, at most [`MAX_SKIP`].
const ZERO_CUTS: u32 = 4;
const MAX_SKIP: u32 = 16;

/// A session's first rounds teach neither the verify cost nor the speed guard: the forwards
/// right after a prefill run slow for a while (on a 2-vCPU Intel Xeon a bench's AR rounds took
/// 1.5×, 1.4×, 1.2×, 1.1× the steady one over the first four rounds after the prompt), and a
/// round priced or judged there would be held against its draft size (or against drafting) for
/// the rest of the session.
const SETTLING_ROUNDS: u64 = 4;

/// What sizing knows of a round before drafting.
#[derive(Clone, Copy, Debug)]
pub struct RoundFacts {
    /// The most nodes the drafter proposes.
    pub max: usize,
    /// Nodes the KV cache has room for.
    pub room: usize,
    /// The forward the round is verified in.
    pub batch: BatchShape,
    /// Whether the drafter's nodes come in score order with path probabilities
    /// ([`crate::speculative::Drafter::node_confidence`]): trees, cut after drafting.
    pub trees: bool,
}

/// A round's draft after sizing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cut {
    /// Σ path probability of the nodes kept (trees).
    pub predicted: f64,
    /// Why nothing is drafted this round (`None`: something is, or sizing is fixed).
    pub undrafted: Option<Undrafted>,
}

/// A verified round, as sizing learns from it.
#[derive(Clone, Copy, Debug)]
pub struct RoundResult {
    pub facts: RoundFacts,
    /// Nodes verified and the deepest of them.
    pub nodes: usize,
    pub depth: usize,
    /// [`Cut::predicted`].
    pub predicted: f64,
    pub accepted: usize,
    pub draft_ms: f64,
    /// The round from draft to commit.
    pub ms: f64,
    /// The batched forward the round was verified in (rows in all, ms), when it held other
    /// sessions' rows too.
    pub batch_forward: Option<(usize, f64)>,
    /// The 1-based depth of the draft's first stop token (what ADL reads; found only when
    /// [`Sizing::reads_eos`]).
    pub eos: Option<usize>,
}

/// How each round's draft is sized, behind one interface: [`Sizing::before`] drafting (the
/// budget), [`Sizing::cut`] after it (trees cut where nodes stop paying), [`Sizing::after`]
/// the round (what was accepted). The policies — the cost model for chains, confidence-cut
/// trees, ADL, the speed guard — live in [`Sizer`]; `Fixed` always drafts the most.
#[derive(Clone, Debug)]
pub enum Sizing {
    Fixed,
    Sized(Box<Sizer>),
}

impl Sizing {
    /// Sized by `sizer`, or fixed without one.
    pub fn new(sizer: Option<Sizer>) -> Self {
        match sizer {
            Some(s) => Sizing::Sized(Box::new(s)),
            None => Sizing::Fixed,
        }
    }

    /// This round's budget, before drafting.
    pub fn before(&mut self, f: &RoundFacts) -> usize {
        match self {
            Sizing::Fixed => f.max,
            Sizing::Sized(s) => s.budget(f.max, f.batch, f.trees),
        }
        .min(f.room)
    }

    /// The round's forward as the cost curve prices it (streams only when sizing is fixed).
    pub fn price(&self, f: &RoundFacts) -> crate::speculative::BatchPrice {
        let streams = f.batch.streams.max(1);
        let (step_ms, row_ms) = match self {
            Sizing::Fixed => (0.0, 0.0),
            Sizing::Sized(s) => {
                let base = f.batch.prefill + streams;
                (s.cost.ms(base), s.cost.added_ms(base, 1))
            }
        };
        crate::speculative::BatchPrice {
            streams,
            step_ms,
            row_ms,
        }
    }

    /// Cuts the proposed `tree` to what pays (trees: by each node's path probability `conf`,
    /// with `draft_ms` already spent) and to `budget`.
    pub fn cut(
        &self,
        tree: &mut crate::speculative::DraftTree,
        conf: Option<&[f32]>,
        draft_ms: f64,
        budget: usize,
        f: &RoundFacts,
    ) -> Cut {
        let mut predicted = 0.0;
        if let (Sizing::Sized(s), Some(conf)) = (self, conf) {
            let keep = s.cut(conf, draft_ms, f.batch).min(budget);
            predicted = conf[..keep.min(conf.len())].iter().map(|&p| p as f64).sum();
            tree.truncate(keep);
        }
        tree.truncate(budget);
        let undrafted = match self {
            Sizing::Fixed => None,
            Sizing::Sized(s) => s
                .undrafted()
                .or_else(|| (tree.is_empty() && budget > 0).then_some(Undrafted::CostModel)),
        };
        Cut {
            predicted,
            undrafted,
        }
    }

    /// Whether [`Sizing::after`] reads [`RoundResult::eos`] (ADL does; nothing else).
    pub fn reads_eos(&self) -> bool {
        matches!(self, Sizing::Sized(s) if s.adl.is_some())
    }

    /// Learns from a verified round.
    pub fn after(&mut self, r: &RoundResult) {
        let Sizing::Sized(s) = self else {
            return;
        };
        s.rounds += 1;
        // A session alone in its forward learns what its verify costs; in a batch, what the
        // whole forward cost for its rows in all (the size the batch's share is priced at).
        // Not from its first rounds: they run in the prefill's wake ([`SETTLING_ROUNDS`]).
        let settled = s.settled();
        match r.batch_forward {
            Some((rows, ms)) if settled => s.cost.observe(rows, ms),
            None if settled && r.facts.batch.streams <= 1 && r.facts.batch.prefill == 0 => {
                s.cost.observe(r.nodes + 1, r.ms - r.draft_ms)
            }
            _ => {}
        }
        if r.facts.trees {
            s.observe_cut(r.nodes, r.accepted);
            s.observe_tree(r.nodes, r.predicted, r.accepted, r.draft_ms);
        } else {
            s.observe(r.depth, r.accepted, r.draft_ms, r.nodes);
        }
        s.record_round(r.accepted + 1, r.ms, r.nodes > 0, r.accepted, || r.eos);
    }
}

/// Online acceptance statistics and the draft-size choice.
#[derive(Clone, Debug)]
pub struct Sizer {
    /// The target's verify cost: the measured curve, corrected by what rounds took.
    cost: LearnedCost,
    /// Chains: acceptance per depth given the depth above accepted.
    depths: DepthRates,
    /// Drafting ms per proposed node (exponential moving average).
    draft_ms_per_node: f64,
    /// The drafter's measured cost of a proposal of n nodes, when known (instead of the
    /// per-node average).
    draft_curve: Option<CostCurve>,
    /// Tree sizing: accepted nodes and the drafter's predicted acceptance (Σ path
    /// probabilities) of the nodes verified, decayed.
    tree_accepted: f64,
    tree_predicted: f64,
    /// Tree rounds, recent average: (accepted nodes, verified nodes, drafting ms).
    tree_recent: (f64, f64, f64),
    /// The cost model checked against the clock.
    guard: SpeedGuard,
    /// DiffuSpec's adaptive draft length instead of the cost model (chains).
    adl: Option<crate::speculative::cps::Adl>,
    /// Why the last [`Sizer::budget`] was 0 (`None`: it was not).
    undrafted: Option<Undrafted>,
    /// Whether the last [`Sizer::budget`] asked the drafter for nodes (a tree cut to nothing
    /// afterwards was still asked: its proposal cost the round time).
    asked: bool,
    /// Tree rounds in a row that were asked for a proposal and cut it to nothing, and the
    /// rounds left that ask for none.
    zero_cuts: u32,
    skip: u32,
    /// Rounds verified so far.
    rounds: u64,
    /// Where the guard is left for the process's next session.
    memory: Option<GuardMemory>,
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
            cost: LearnedCost::new(curve),
            depths: DepthRates::new(DECAY),
            draft_ms_per_node: 0.0,
            draft_curve: None,
            tree_accepted: 0.0,
            tree_predicted: 0.0,
            tree_recent: (0.0, 0.0, 0.0),
            guard: SpeedGuard::default(),
            adl: None,
            undrafted: None,
            asked: false,
            zero_cuts: 0,
            skip: 0,
            rounds: 0,
            memory: None,
        }
    }

    /// Starts from the guard the process's last session left in `memory` (if any), and leaves
    /// this one's there when dropped.
    pub fn with_guard_memory(mut self, memory: GuardMemory) -> Self {
        if let Some(g) = memory.recall() {
            self.guard = g;
        }
        self.memory = Some(memory);
        self
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
    fn budget(&mut self, max: usize, b: BatchShape, trees: bool) -> usize {
        self.undrafted = None;
        self.asked = false;
        // The guard's phases start past the prefill's wake (its first rounds are not timed);
        // a hold that an earlier session began holds there too.
        if self.adl.is_none() {
            let why = if self.settled() {
                self.guard.why_not()
            } else {
                self.guard.holding().then_some(Undrafted::SpeedGuard)
            };
            if let Some(why) = why {
                self.undrafted = Some(why);
                return 0;
            }
        }
        let n = if trees && self.skip > 0 {
            // Recent proposals were all cut to nothing: each cost its lookups or its model
            // pass for no node ([`Sizer::record_round`]).
            self.skip -= 1;
            0
        } else if trees {
            self.choose_tree(max, b)
        } else {
            self.choose(max, b)
        };
        if n == 0 && max > 0 {
            self.undrafted = Some(Undrafted::CostModel);
        }
        self.asked = n > 0;
        n
    }

    /// Whether this session's rounds are past the prefill's wake ([`SETTLING_ROUNDS`]).
    fn settled(&self) -> bool {
        self.rounds > SETTLING_ROUNDS
    }

    /// Why the last budget was 0 (`None` when it was not).
    fn undrafted(&self) -> Option<Undrafted> {
        self.undrafted
    }

    /// After a round that committed `tokens` in `ms` (draft to commit), with or without verified
    /// draft nodes, `accepted` of them accepted: ADL's update (`eos`: the 1-based depth of the
    /// draft's first stop token), or the speed guard's. The guard times a drafting phase's
    /// rounds whether or not they verified nodes: a tree proposed and then cut to nothing cost
    /// its proposal (on a 2-vCPU Xeon at T = 1, 3,160 of `auto`'s 5,679 rounds, each 1.04× an AR
    /// round), and an AR round after a drafted one pays for what drafting left behind.
    fn record_round(
        &mut self,
        tokens: usize,
        ms: f64,
        drafted: bool,
        accepted: usize,
        eos: impl FnOnce() -> Option<usize>,
    ) {
        let settled = self.settled();
        match &mut self.adl {
            Some(a) if drafted => a.observe(eos(), accepted),
            Some(_) => {}
            None if settled => self.guard.observe(tokens, ms),
            None => {}
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
        self.depths.rate(d)
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
    /// decoding sessions verifies `rows` rows, next to `prefill` prompt rows: what the decoding
    /// rows add to the step, (c(prefill + streams · rows) − c(prefill)) / streams. Alone (1
    /// stream, no prefill) it is c(rows). The prompt rows are prefilled whatever is drafted:
    /// counted in, their cost made a compute-bound step look as if a few more rows cost
    /// nothing, and sessions verified whole trees beside a prompt (`serve` at 16 streams on a
    /// Zen 4: 1,503–1,570 drafted rows per run in the steps with prompt rows, which took
    /// 4.5–5.4 s against AR's 3.0–3.9; docs/auto.md, "Drafting beside a prompt").
    fn share_ms(&self, rows: usize, b: BatchShape) -> f64 {
        let n = b.streams.max(1);
        let ms = self.cost.added_ms(b.prefill, n * rows) / n as f64;
        // A curve learned noisily could make the difference vanish: no size is then free.
        ms.max(1e-6)
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

    /// Tree sizing, before drafting: the full `max` when proposing costs little (the size is
    /// cut after drafting), else about what recent cuts kept. In a batch, a tree is drafted
    /// only if a recent tree round (its nodes, accepted tokens and drafting ms, averaged) would beat no draft
    /// with every session of the batch doing the same.
    pub fn choose_tree(&self, max: usize, b: BatchShape) -> usize {
        if (b.streams > 1 || b.prefill > 0) && !self.a_tree_can_pay(max, b) {
            return 0;
        }
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
        // Proposing that costs little next to a decode step (lookups) is left to the cut. A
        // model's tree search costs with the nodes asked for: ask for what recent cuts kept,
        // with room to grow (twice as many, and 4 more), not for the most. Whether proposing
        // pays at all is the speed guard's call, on the clock: a gate on the trees' estimated
        // gain (an average that AR rounds drifted back to 1 over dozens of rounds) kept a
        // Xeon's `auto` from proposing in most of the 1,372 of 3,870 T = 0 rounds it asked for
        // nothing once the verify curve was measured right, while the cut alone, replayed on
        // rounds that proposed, lost nothing.
        let cheap = self.tree_recent.1 > 0.0 && self.tree_recent.2 < 0.1 * self.cost.ms(1);
        let recent = self.tree_recent.1;
        if cheap || recent == 0.0 {
            max
        } else {
            max.min((2.0 * recent).ceil() as usize + TREE_ROOM)
        }
    }

    /// Whether a tree of at most `max` nodes could beat no draft in batch `b` at all: with its
    /// deepest path accepted whole (at most 1 + n tokens for n nodes) and drafted for free,
    /// by more than 1 % (less would not pay for the proposal).
    /// Where the step is compute-bound every row costs about what a token is worth, and none
    /// can: asking for a proposal then only costs the proposal, which the cut throws away
    /// (`serve` with `auto` at 64 streams on a 2-vCPU Zen 5: 3,600 such rounds in a run).
    /// Trees beyond [`BOUND_NODES`] are not tried (the check runs each round).
    fn a_tree_can_pay(&self, max: usize, b: BatchShape) -> bool {
        let without = 1.0 / self.share_ms(1, b);
        (1..=max.min(BOUND_NODES))
            .any(|n| (1 + n) as f64 / self.share_ms(n + 1, b) > 1.01 * without)
    }

    /// Tree sizing, after drafting: how many of the tree's nodes (in score order, so any prefix
    /// is a tree) to verify, given each node's path probability `conf` and the ms already spent
    /// drafting: argmax over n of (1 + κ Σ_{i<n} conf_i) / (share of c(n + 1) + draft_ms), the
    /// share as in [`Sizer::choose`].
    fn cut(&self, conf: &[f32], draft_ms: f64, b: BatchShape) -> usize {
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
        if best == 0 && self.zero_cuts >= ZERO_CUTS && !conf.is_empty() {
            // The first proposal after a backoff verifies its best node: κ learns only from
            // verified nodes, so a run of empty cuts would otherwise never learn that they
            // were too cautious (`auto` on MATH-500 at T = 0 on a Xeon: 1-node rounds accepted
            // 0.40 when verified, and with the backoff alone 490 of 858 rounds drafted nothing).
            best = 1;
        }
        best
    }

    /// After a tree round that verified `nodes` (`accepted` of them): a proposal cut to
    /// nothing lengthens the run of empty cuts, and from [`ZERO_CUTS`] of them on the next 2,
    /// 4, … [`MAX_SKIP`] rounds ask for no proposal, the first proposal after them verifying
    /// its best node ([`Sizer::cut`]); a node cut in on its merits, or an explored one that
    /// was accepted, ends the run.
    fn observe_cut(&mut self, nodes: usize, accepted: usize) {
        let explored = nodes > 0 && self.zero_cuts >= ZERO_CUTS;
        if nodes > 0 && (!explored || accepted > 0) {
            self.zero_cuts = 0;
        } else if self.asked {
            self.zero_cuts += 1;
            if self.zero_cuts >= ZERO_CUTS {
                self.skip = (2u32 << (self.zero_cuts - ZERO_CUTS).min(8)).min(MAX_SKIP);
            }
        }
    }

    /// Records a tree round: `nodes` verified, the sum of their path probabilities
    /// (`predicted`), how many were accepted, and the round's drafting ms (`nodes` 0: an AR
    /// round).
    fn observe_tree(&mut self, nodes: usize, predicted: f64, accepted: usize, draft_ms: f64) {
        if nodes == 0 {
            return;
        }
        let r = &mut self.tree_recent;
        let w = if r.1 == 0.0 { 1.0 } else { 0.2 };
        *r = (
            (1.0 - w) * r.0 + w * accepted as f64,
            (1.0 - w) * r.1 + w * nodes as f64,
            (1.0 - w) * r.2 + w * draft_ms,
        );
        self.tree_accepted = DECAY * self.tree_accepted + accepted as f64;
        self.tree_predicted = DECAY * self.tree_predicted + predicted;
    }

    /// Records a round: `drafted_depth` = deepest proposed depth, `accepted` = accepted length.
    /// Rounds without drafts still decay the statistics towards the prior, so a drafter that
    /// was switched off is tried again after a while.
    fn observe(
        &mut self,
        drafted_depth: usize,
        accepted: usize,
        draft_ms: f64,
        drafted_nodes: usize,
    ) {
        self.depths.observe(drafted_depth, accepted);
        if drafted_nodes > 0 {
            let per = draft_ms / drafted_nodes as f64;
            self.draft_ms_per_node = 0.8 * self.draft_ms_per_node + 0.2 * per;
        }
    }
}

impl Drop for Sizer {
    fn drop(&mut self) {
        if let Some(m) = &self.memory {
            if self.settled() {
                m.store(&self.guard);
            }
        }
    }
}

#[cfg(test)]
mod tests;
