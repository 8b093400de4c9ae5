//! The speed guard (the cost model checked against the clock) and why a round drafted
//! nothing.

use super::CostCurve;

/// Why a sized round drafted nothing (reported in its [`crate::speculative::RoundStats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Undrafted {
    /// The speed guard holds drafting off: drafting measured slower than AR on this machine.
    SpeedGuard,
    /// One round in `probe_every` runs without a draft so that AR's speed stays measured.
    Probe,
    /// The cost model found no draft worth its verify rows here (c(k) against acceptance), or
    /// a tree drafter's recent proposals were all cut to nothing and it backs off.
    CostModel,
}

impl Undrafted {
    /// Its name in reports and metrics (as serialized).
    pub fn name(self) -> &'static str {
        match self {
            Undrafted::SpeedGuard => "speed_guard",
            Undrafted::Probe => "probe",
            Undrafted::CostModel => "cost_model",
        }
    }
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

/// Timed AR rounds: committed tokens and wall-clock ms, decayed sums (≈ 20 rounds).
#[derive(Clone, Copy, Debug, Default)]
struct Rate {
    tokens: f64,
    ms: f64,
    n: u32,
}

impl Rate {
    fn add(&mut self, tokens: f64, ms: f64) {
        self.tokens = 0.95 * self.tokens + tokens;
        self.ms = 0.95 * self.ms + ms;
        self.n += 1;
    }
    fn per_ms(&self) -> f64 {
        self.tokens / self.ms.max(1e-9)
    }
}

/// What the guard is doing: letting the sizer draft (a drafting phase), or holding drafting
/// off, to measure AR (a probe) or because drafting measured slower (a hold).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Draft,
    Probe,
    Hold,
}

/// The cost model checked against the clock, as two policies timed in phases: drafting
/// phases (the sizer drafts as it sees fit; every round counts, with its drafting, its
/// verify and whatever it leaves the next rounds to pay) against AR phases (nothing
/// drafted). After each phase the two are compared: drafting stays or comes back on only
/// when its rounds committed more than AR's rate would have in their time, by more than
/// `z` standard errors of that excess (with a `margin` against AR), else drafting is held off
/// for `hold` rounds, twice as long after each hold in a row, and then drafted for
/// `probe_draft` rounds to be measured afresh. A drafting phase that pays runs `draft_phase`
/// rounds, twice as long after each in a row, and is followed by an AR probe of `probe_ar`
/// rounds (skipped while drafting is clearly `skip_margin` ahead of AR's last rate, at most
/// [`MAX_SKIPPED`] times in a row); it ends early when its rounds clearly lose to AR's rate (a
/// hold), or when at a check every [`RECHECK`] rounds they fall behind it (a probe, then the
/// comparison afresh).
///
/// AR is measured in stretches, not single rounds, and the first `wake` rounds of a stretch
/// are not timed: on a 2-vCPU Intel Xeon, in T = 1 bench runs of `auto` and `dart`, the 1st to
/// 6th AR round after drafting took 1.33, 1.33, 1.30, 1.27, 1.24 and 1.16× the AR run's
/// rounds, and only from the 7th on 0.95–1.05× (at T = 0: 1.57 down to 1.16×; `examples/wake.rs`
/// shows the same after one 16-row forward). The old guard timed lone AR probes there, priced
/// AR a quarter too dear, and kept drafting that lost to AR by 10–25 % (docs/auto.md, "Never
/// slower than AR").
#[derive(Clone, Debug)]
pub struct SpeedGuard {
    phase: Phase,
    /// Observed rounds left in the phase.
    left: u64,
    /// Drafting phases that paid, and holds, in a row.
    wins: u32,
    holds: u32,
    /// AR rounds of the current stretch observed so far.
    stretch: u64,
    /// Rounds of the current drafting phase observed so far.
    in_phase: u64,
    /// AR probes skipped in a row (drafting far ahead of AR's rate).
    skipped: u32,
    ar: Rate,
    /// The recent drafting phases' rounds: (tokens, ms).
    drafted: std::collections::VecDeque<(f64, f64)>,
    pub draft_phase: u64,
    pub probe_draft: u64,
    pub probe_ar: u64,
    pub hold: u64,
    pub wake: u64,
    pub margin: f64,
    pub z: f64,
    pub cut_z: f64,
    /// A drafting phase whose rounds commit this much more than AR's last rate would have
    /// (clearly, by `cut_z` standard errors) goes on without an AR probe, at most
    /// [`MAX_SKIPPED`] times in a row.
    pub skip_margin: f64,
}

/// Drafting rounds the guard weighs (the latest).
const DRAFTED_KEPT: usize = 64;
/// Longest phase, in rounds.
const MAX_PHASE: u64 = 4096;
/// Every so many rounds of a drafting phase its rounds are checked against AR's rate: behind
/// it by `z` standard errors (not clearly, as `cut_z` asks), the phase ends early.
const RECHECK: u64 = 24;
/// Doublings of a phase's length in a row, at most.
const MAX_DOUBLINGS: u32 = 6;
/// AR probes skipped in a row, at most: AR's rate is timed afresh at least this often.
const MAX_SKIPPED: u32 = 3;

impl Default for SpeedGuard {
    fn default() -> Self {
        let probe_ar = 12;
        SpeedGuard {
            phase: Phase::Probe,
            left: probe_ar,
            wins: 0,
            holds: 0,
            stretch: 0,
            in_phase: 0,
            skipped: 0,
            ar: Rate::default(),
            drafted: Default::default(),
            draft_phase: 48,
            probe_draft: 12,
            probe_ar,
            hold: 48,
            wake: 6,
            margin: 0.02,
            z: 0.0,
            cut_z: 1.5,
            skip_margin: 0.25,
        }
    }
}

impl SpeedGuard {
    /// Whether this round may draft.
    pub fn allows_draft(&self) -> bool {
        self.why_not().is_none()
    }

    /// Why this round may not draft, if it may not.
    pub fn why_not(&self) -> Option<Undrafted> {
        match self.phase {
            Phase::Draft => None,
            Phase::Probe => Some(Undrafted::Probe),
            Phase::Hold => Some(Undrafted::SpeedGuard),
        }
    }

    /// A round committed `tokens` in `ms` (whether or not it drafted: a drafting phase is
    /// timed as a whole).
    pub fn observe(&mut self, tokens: usize, ms: f64) {
        if !(ms.is_finite() && ms > 0.0) {
            return;
        }
        if self.phase == Phase::Draft {
            self.stretch = 0;
            if self.drafted.len() == DRAFTED_KEPT {
                self.drafted.pop_front();
            }
            self.drafted.push_back((tokens as f64, ms));
        } else {
            self.stretch += 1;
            if self.stretch > self.wake {
                self.ar.add(tokens as f64, ms);
            }
        }
        self.left = self.left.saturating_sub(1);
        if self.left == 0 {
            self.next_phase();
        } else if self.phase == Phase::Draft {
            self.in_phase += 1;
            if self.clearly_losing() {
                // A drafter far slower than AR is not drafted to the end of its phase.
                self.ar_known_hold();
            } else if self.in_phase.is_multiple_of(RECHECK)
                && self.excess().is_some_and(|(m, se)| m + self.z * se < 0.0)
            {
                // A long phase whose drafting fell behind AR's last rate: AR is timed afresh
                // (the rate may be old) and the two compared again.
                self.skipped = 0;
                self.phase = Phase::Probe;
                self.left = self.probe_ar;
            }
        }
        if self.phase != Phase::Draft {
            self.in_phase = 0;
        }
    }

    /// Whether the drafting rounds so far (4 at least) lose to AR's measured rate by more
    /// than `cut_z` standard errors.
    fn clearly_losing(&self) -> bool {
        self.drafted.len() >= 4
            && self
                .excess()
                .is_some_and(|(m, se)| m + self.cut_z * se < 0.0)
    }

    /// Ends a drafting phase cut short: a hold (AR is measured; its rate is what drafting lost to).
    fn ar_known_hold(&mut self) {
        self.wins = 0;
        self.holds += 1;
        self.phase = Phase::Hold;
        self.left = (self.hold << (self.holds - 1).min(MAX_DOUBLINGS)).clamp(1, MAX_PHASE);
    }

    /// The recent drafting rounds' mean excess over AR's timed rate (tokens committed minus
    /// what AR, `margin` faster, would have in the round's ms) and its standard error; `None`
    /// while either side is unmeasured.
    fn excess(&self) -> Option<(f64, f64)> {
        self.excess_at(self.margin)
    }

    /// [`SpeedGuard::excess`] against AR `margin` faster.
    fn excess_at(&self, margin: f64) -> Option<(f64, f64)> {
        let n = self.drafted.len() as f64;
        if self.ar.n == 0 || n < 2.0 {
            return None;
        }
        let ar = self.ar.per_ms() * (1.0 + margin);
        let ex = |&(t, ms): &(f64, f64)| t - ms * ar;
        let mean = self.drafted.iter().map(ex).sum::<f64>() / n;
        let var = self
            .drafted
            .iter()
            .map(|r| (ex(r) - mean).powi(2))
            .sum::<f64>()
            / (n - 1.0);
        Some((mean, (var / n).sqrt()))
    }

    /// Whether drafting beats AR: its mean excess above `z` standard errors.
    fn drafting_pays(&self) -> Option<bool> {
        self.excess().map(|(m, se)| m > self.z * se)
    }

    /// Whether the recent drafting rounds (8 at least) committed `skip_margin` more than AR's
    /// measured rate would have in their time, by more than `cut_z` standard errors: an AR
    /// probe could not change the verdict, and would cost its rounds and their wake (at a τ of
    /// 3–5, as second turns that repeat the first answer reach, 12 AR rounds lose 25–50 tokens).
    fn clearly_paying(&self) -> bool {
        self.drafted.len() >= 8
            && self
                .excess_at(self.skip_margin)
                .is_some_and(|(m, se)| m - self.cut_z * se > 0.0)
    }

    /// The length of a drafting phase after one more that paid: twice the last, up to
    /// [`MAX_DOUBLINGS`] doublings.
    fn won_phase(&mut self) -> u64 {
        let len = self.draft_phase << self.wins.min(MAX_DOUBLINGS);
        self.wins += 1;
        len
    }

    /// Draft → AR probe → (drafting pays: a drafting phase, longer after each that paid; it
    /// does not: a hold, longer after each in a row) → … ; a hold ends in a drafting probe.
    fn next_phase(&mut self) {
        let (phase, len) = match self.phase {
            Phase::Draft if self.skipped < MAX_SKIPPED && self.clearly_paying() => {
                self.skipped += 1;
                (Phase::Draft, self.won_phase())
            }
            Phase::Draft => {
                self.skipped = 0;
                (Phase::Probe, self.probe_ar)
            }
            Phase::Hold => {
                // Drafting is measured afresh: the rounds it drafted before the hold are old.
                self.drafted.clear();
                (Phase::Draft, self.probe_draft)
            }
            Phase::Probe => match self.drafting_pays() {
                None if self.ar.n == 0 => (Phase::Probe, self.probe_ar),
                None => (Phase::Draft, self.probe_draft),
                Some(true) => {
                    self.holds = 0;
                    (Phase::Draft, self.won_phase())
                }
                Some(false) => return self.ar_known_hold(),
            },
        };
        self.phase = phase;
        self.left = len.clamp(1, MAX_PHASE);
    }

    /// Drafting on for good (tests of the other policies).
    #[cfg(test)]
    pub(super) fn stay_on(&mut self) {
        self.phase = Phase::Draft;
        self.left = u64::MAX;
    }

    /// Observed rounds left in the phase (tests).
    #[cfg(test)]
    pub(super) fn left(&self) -> u64 {
        self.left
    }

    /// Drafting held off for `rounds` observed rounds (tests).
    #[cfg(test)]
    pub(super) fn hold_for(&mut self, rounds: u64) {
        self.phase = Phase::Hold;
        self.left = rounds;
    }

    /// Whether drafting is held off (a hold, not a probe).
    pub fn holding(&self) -> bool {
        self.phase == Phase::Hold
    }

    /// This guard as the next session of the process starts from it: the phases and rates go
    /// on, but a hold ends where the session starts, in a drafting probe (a request on other
    /// text may draft better); should the probe lose, the hold after it is the third of a row
    /// (192 rounds: one probe per request of a few hundred tokens, where a carried hold used
    /// to end within 48 rounds and the 96-round one after it ended the request). At T = 0.7
    /// on a 2-vCPU Xeon a hold begun on MT-Bench, doubled from request to request, kept GSM8K
    /// and MBPP,
    /// where drafting had paid 1.25–1.29×, from drafting at all; on a Zen 4 at T = 0, holds
    /// carried into MT-Bench's second turns (which repeat the first answer: `auto` went on at
    /// τ 3–5 once they ended) held off their first 52 rounds of 128. A drafter that loses is
    /// cut within the probe's first 4 rounds when it clearly does. Nothing of this session's
    /// last AR stretch is in the wake of the next one's prefill.
    fn resumed(&self) -> SpeedGuard {
        let mut g = SpeedGuard {
            stretch: 0,
            in_phase: 0,
            ..self.clone()
        };
        if g.phase == Phase::Hold {
            // The hold's end (`next_phase`): a drafting probe, measured afresh.
            g.holds = g.holds.min(2);
            g.next_phase();
        }
        g
    }
}

/// Where a process's sessions leave their speed guard for the next session (one per drafter
/// set and kind of sampling: greedy and sampled rounds pay differently), so that a server or a
/// bench does not re-learn in every request what the last ones measured: a drafter held off
/// stays off for the next request (until its hold ends), one that pays drafts from its first
/// round. [`GuardMemory::persisted`] keeps it in a file too, for the next process.
#[derive(Clone, Debug, Default)]
pub struct GuardMemory {
    slot: std::sync::Arc<std::sync::Mutex<Option<SpeedGuard>>>,
    file: Option<std::sync::Arc<std::path::PathBuf>>,
}

/// A guard's state as kept on disk.
#[derive(serde::Serialize, serde::Deserialize)]
struct Saved {
    version: u32,
    phase: String,
    left: u64,
    wins: u32,
    holds: u32,
    ar: (f64, f64, u32),
    drafted: Vec<(f64, f64)>,
}

impl SpeedGuard {
    fn saved(&self) -> Saved {
        Saved {
            version: 1,
            phase: format!("{:?}", self.phase).to_lowercase(),
            left: self.left,
            wins: self.wins,
            holds: self.holds,
            ar: (self.ar.tokens, self.ar.ms, self.ar.n),
            drafted: self.drafted.iter().copied().collect(),
        }
    }

    /// The guard `s` describes, when it is one this build wrote and every figure is sane.
    fn from_saved(s: Saved) -> Option<SpeedGuard> {
        let phase = match s.phase.as_str() {
            "draft" => Phase::Draft,
            "probe" => Phase::Probe,
            "hold" => Phase::Hold,
            _ => return None,
        };
        let finite = |x: f64| x.is_finite() && x >= 0.0;
        let ok = s.version == 1
            && s.left <= MAX_PHASE
            && finite(s.ar.0)
            && finite(s.ar.1)
            && s.drafted.len() <= DRAFTED_KEPT
            && s.drafted.iter().all(|&(t, ms)| finite(t) && finite(ms));
        ok.then(|| SpeedGuard {
            phase,
            left: s.left.max(1),
            wins: s.wins.min(MAX_DOUBLINGS),
            holds: s.holds.min(MAX_DOUBLINGS + 1),
            ar: Rate {
                tokens: s.ar.0,
                ms: s.ar.1,
                n: s.ar.2,
            },
            drafted: s.drafted.into_iter().collect(),
            ..SpeedGuard::default()
        })
    }
}

impl GuardMemory {
    /// A memory kept in `file` as well: it starts from the guard the file holds (a missing,
    /// unreadable or foreign file: from none) and rewrites the file whenever a session leaves
    /// its guard (failures to write only lose the memory, never the request).
    pub fn persisted(file: std::path::PathBuf) -> GuardMemory {
        let saved = std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice::<Saved>(&b).ok())
            .and_then(SpeedGuard::from_saved);
        GuardMemory {
            slot: std::sync::Arc::new(std::sync::Mutex::new(saved)),
            file: Some(std::sync::Arc::new(file)),
        }
    }

    /// The guard the last session left, resumed.
    pub fn recall(&self) -> Option<SpeedGuard> {
        self.slot.lock().ok()?.as_ref().map(SpeedGuard::resumed)
    }

    pub fn store(&self, g: &SpeedGuard) {
        if let Ok(mut m) = self.slot.lock() {
            *m = Some(g.clone());
        }
        if let Some(file) = &self.file {
            super::keep_json(file, &g.saved());
        }
    }
}
