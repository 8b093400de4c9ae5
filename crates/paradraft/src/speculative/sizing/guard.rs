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

/// Drafting rounds' excess over AR: per round, tokens committed minus what AR would have
/// committed in the round's ms (decayed sums, ≈ 20 rounds).
#[derive(Clone, Copy, Debug, Default)]
struct Excess {
    n: f64,
    sum: f64,
    sq: f64,
}

impl Excess {
    fn add(&mut self, x: f64) {
        const DECAY: f64 = 0.95;
        self.n = DECAY * self.n + 1.0;
        self.sum = DECAY * self.sum + x;
        self.sq = DECAY * self.sq + x * x;
    }

    /// Whether the mean excess is below 0 by more than `z` standard errors.
    fn clearly_negative(&self, z: f64) -> bool {
        if self.n < 2.0 {
            return false;
        }
        let mean = self.sum / self.n;
        let var = (self.sq / self.n - mean * mean).max(0.0) * self.n / (self.n - 1.0);
        mean + z * (var / self.n).sqrt() < 0.0
    }
}

/// The cost model checked against the clock: the measured committed tokens per ms of the rounds
/// that drafted (whose drafter was asked for a draft, whether or not any of it was verified)
/// and of those that did not (each round timed from its draft to its commit, the target's
/// forward included). When drafting measures slower than AR by more than `margin`,
/// clearly (by `z` standard errors of the drafting rounds' excess over AR: a round commits 1 to
/// 8 tokens, so a few rounds prove nothing), nothing is drafted for `hold` rounds (then
/// drafting is measured afresh); while drafting, one round in `probe_every` runs without a
/// draft so that AR's speed stays measured. Whatever the cost model misses on this machine
/// (per-round overheads, a drafter's passes it undercounts), speculation then costs at most its
/// probes when it does not pay.
#[derive(Clone, Debug)]
pub struct SpeedGuard {
    /// Drafting rounds since drafting was last (re)started.
    drafted: u32,
    excess: Excess,
    ar: Rate,
    pub(super) round: u64,
    pub(super) off_until: u64,
    pub probe_every: u64,
    pub hold: u64,
    pub margin: f64,
    pub z: f64,
}

impl Default for SpeedGuard {
    fn default() -> Self {
        SpeedGuard {
            drafted: 0,
            excess: Excess::default(),
            ar: Rate::default(),
            round: 0,
            off_until: 0,
            probe_every: 16,
            hold: 64,
            margin: 0.02,
            z: 1.5,
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
            self.drafted += 1;
            if self.ar.n > 0 {
                let ar = self.ar.per_ms() * (1.0 - self.margin);
                self.excess.add(tokens as f64 - ms * ar);
            }
        } else {
            self.ar.add(tokens as f64, ms);
        }
        if self.drafted >= 8 && self.ar.n >= 3 && self.excess.clearly_negative(self.z) {
            self.off_until = self.round + self.hold;
            self.drafted = 0;
            self.excess = Excess::default();
        }
    }
}
