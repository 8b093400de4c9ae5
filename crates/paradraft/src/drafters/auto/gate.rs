//! When `auto` runs its model source. The lookup sources cost microseconds; the model's
//! forward costs a good share of a decode step, so it runs only where it is likely to pay:
//! while the tokens only it proposed and the target accepted (per run, averaged) are worth
//! more decode time than its forward takes. In a batch of B streams a token of this session
//! is worth a B-th of a step, while the forward delays every stream: the bar is B times
//! higher. When it does not pay it still runs every [`PROBE_EVERY`] · B-th round, so that the
//! estimate follows the text at a batch cost that does not grow with B.
//!
//! That estimate leaves out what the model's nodes cost to select and verify, and the tokens
//! the lookups would have had accepted instead. So in a batch a greedy session's gate also
//! times its rounds: tokens committed per ms from one round's start to the next, with the
//! model and without, pooled over the process's sessions ([`Arms`]), and apart for rounds
//! whose lookups already expect [`ENOUGH`] accepted nodes and the rest (the model adds less
//! to the first). Once both arms of a kind of round are measured the model runs there only
//! while its rounds are as fast, and one round in [`PROBE_EVERY`] takes the other arm so both
//! stay measured.
//!
//! A session decoding alone runs its model in every round, at any temperature; the sizer's
//! cut prices its nodes and the speed guard weighs the whole policy against AR. At T > 0 the
//! two arms' rates differed by less than their noise, and the estimate, fed by few accepted
//! tokens, kept falling below its bar (on a Zen 4 at T = 1, 29–79 % of `auto`'s rounds drafted
//! nothing), while asking the model every round measured 5–7 % faster (docs/notebook.md, "The
//! model leads at T > 0"). At T = 0 on a 2-vCPU Intel Xeon the arms locked the model out
//! where it paid: a model round after rounds without it catches up their tokens (0.72 ms a
//! proposal after 2–3 pending tokens, 1.23 ms after 25), so its probes timed dear and the
//! lookups kept the rounds — on GSM8K the model ran in 64 of 298 rounds and `auto` trailed
//! `dart` alone; asked every round, `auto` went from 1.25–1.30× to 1.32–1.39× AR (geomean of
//! MT-Bench, GSM8K, MBPP, four interleaved rounds; docs/auto.md, "The model in every round at
//! T = 0"). In a batch the estimate's bar stands.

use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Rounds between probes of a model source that does not pay.
pub const PROBE_EVERY: usize = 8;
/// Expected accepted lookup nodes from which a round is timed as one where the lookups are
/// strong.
const ENOUGH: f64 = 1.5;
/// Timed rounds each arm needs before the comparison decides.
const ARM_MIN: usize = 4;
/// Weight of a round in an arm's moving averages.
const ARM_W: f64 = 0.1;

/// The two arms' timings (without the model, with it) for rounds whose lookups are weak and
/// for those where they are strong, shared by the sessions of a process that draft at one
/// kind of temperature (greedy, or sampled): a request of a few hundred tokens ends before it
/// has timed them all. With them, the estimate the sessions' model runs taught
/// ([`ModelGate::ran`]), where a session in a batch starts from.
#[derive(Clone, Debug, Default)]
pub struct Arms(Arc<Mutex<Pooled>>);

#[derive(Clone, Debug, Default)]
struct Pooled {
    arms: [[Arm; 2]; 2],
    /// (value, cost ms, model-only nodes verified) per run, and the runs pooled.
    learned: ([f64; 3], usize),
}

impl Arms {
    fn pooled<R>(&self, f: impl FnOnce(&mut Pooled) -> R) -> R {
        // A poisoned lock still holds plain numbers.
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn with<R>(&self, f: impl FnOnce(&mut [[Arm; 2]; 2]) -> R) -> R {
        self.pooled(|p| f(&mut p.arms))
    }

    /// The process's estimate of a model run, once some session ran its model.
    fn learned(&self) -> Option<[f64; 3]> {
        self.pooled(|p| (p.learned.1 > 0).then_some(p.learned.0))
    }
}

/// Moving averages of one arm's decided rounds: ms from a round's start to the next's, and
/// tokens committed in between.
#[derive(Clone, Debug, Default)]
struct Arm {
    ms: f64,
    tokens: f64,
    rounds: usize,
}

impl Arm {
    fn add(&mut self, ms: f64, tokens: f64) {
        self.ms = ema(self.ms, ms, ARM_W);
        self.tokens = ema(self.tokens, tokens, ARM_W);
        self.rounds += 1;
    }

    fn rate(&self) -> f64 {
        self.tokens / self.ms.max(1e-9)
    }
}

#[derive(Clone, Debug)]
pub struct ModelGate {
    /// Accepted tokens only the model proposed, per run (EMA; optimistic start).
    value: f64,
    /// The model's proposal time, ms (EMA).
    cost_ms: f64,
    /// Verified nodes only the model proposed, per run (EMA).
    nodes: f64,
    /// This session's model runs.
    runs: usize,
    /// A round without verified nodes, start to start, ms (EMA): what a token costs without
    /// drafting.
    step_ms: f64,
    /// Rounds of each kind since the model last ran in one.
    since_run: [usize; 2],
    round_start: Option<Instant>,
    /// Decoding sessions sharing the next round's forward (1: alone).
    pub streams: usize,
    /// That forward's expected ms as an AR step, and what one more verified row adds to it,
    /// as sizing prices them (0: unknown).
    pub step_hint: f64,
    pub row_ms: f64,
    /// Rounds without the model (0) and with it (1), by the lookups' strength.
    arms: Arms,
    /// The kind of round (strong lookups) and the arm it took, when the gate decided it.
    arm: Option<(usize, usize)>,
    /// Tokens committed since this round started.
    tokens: usize,
    decided: usize,
    /// Whether, in a batch, the arms' timings decide with the estimate (greedy sessions) or the
    /// estimate alone (sampling ones). Alone, every session runs its model in every round.
    timed: bool,
}

impl Default for ModelGate {
    fn default() -> Self {
        ModelGate {
            value: 1.0,
            cost_ms: 0.0,
            nodes: 0.0,
            runs: 0,
            step_ms: 0.0,
            since_run: [0; 2],
            round_start: None,
            streams: 1,
            step_hint: 0.0,
            row_ms: 0.0,
            arms: Arms::default(),
            arm: None,
            tokens: 0,
            decided: 0,
            timed: true,
        }
    }
}

fn ema(old: f64, new: f64, w: f64) -> f64 {
    if old == 0.0 {
        new
    } else {
        (1.0 - w) * old + w * new
    }
}

impl ModelGate {
    /// A session's gate timing its rounds into `arms`, deciding by them if `timed`.
    pub fn sharing(arms: &Arms, timed: bool) -> Self {
        ModelGate {
            arms: arms.clone(),
            timed,
            ..Default::default()
        }
    }

    /// A round starts; `undrafted` says whether the previous one verified no node (its time
    /// was then a plain decode step).
    pub fn round_starts(&mut self, undrafted: bool) {
        self.round_starts_at(Instant::now(), undrafted)
    }

    fn round_starts_at(&mut self, now: Instant, undrafted: bool) {
        if let Some(t) = self.round_start {
            let ms = (now - t).as_secs_f64() * 1e3;
            if undrafted {
                self.step_ms = ema(self.step_ms, ms, 0.2);
            }
            if let Some((k, a)) = self.arm {
                let tokens = self.tokens as f64;
                self.arms.with(|arms| arms[k][a].add(ms, tokens));
            }
        }
        (self.arm, self.tokens) = (None, 0);
        self.round_start = Some(now);
    }

    /// The round committed `tokens` tokens.
    pub fn committed(&mut self, tokens: usize) {
        self.tokens += tokens;
    }

    /// Whether to run the model this round, the lookups expecting `lookup_expected` accepted
    /// nodes. An undrafted step of `step_ms` commits one token for each of the batch's
    /// `streams`, so this session's token is worth `step_ms / streams` of the batch's time,
    /// and the forward's `cost_ms` is spent by all of them.
    ///
    /// In a batch two more things are priced. The clock cannot tell one session's choice
    /// apart there (the step is everyone's), so the estimate also charges what the arms time
    /// for a session alone: the verify rows of the nodes only the model proposed, each
    /// `row_ms` of the batch's time. And a session that has not run its model yet starts
    /// from the process's estimate (and sizing's step price until it has timed a step of
    /// its own) rather than the optimistic start, which asked the model in the first round
    /// of every request (`serve` at 16 streams on a 2-vCPU Zen 5: the model's passes and
    /// its prompt, ~3 % of the step time, while its nodes were cut or did not pay).
    pub fn run(&mut self, lookup_expected: f64) -> bool {
        if self.every_round() {
            return true;
        }
        let kind = (lookup_expected >= ENOUGH) as usize;
        let b = self.streams.max(1);
        let own = [self.value, self.cost_ms, self.nodes];
        let [value, cost_ms, nodes] = match self.arms.learned() {
            Some(pooled) if b > 1 && self.runs == 0 => pooled,
            _ => own,
        };
        let (step_ms, rows_ms) = match b {
            1 => (self.step_ms, 0.0),
            _ if self.step_ms > 0.0 => (self.step_ms, nodes * self.row_ms),
            _ => (self.step_hint, nodes * self.row_ms),
        };
        let pays = step_ms == 0.0 || value * step_ms >= (cost_ms + rows_ms) * b as f64;
        let faster = !self.timed
            || self.arms.with(|arms| {
                let [without, with] = &arms[kind];
                let timed = without.rounds >= ARM_MIN && with.rounds >= ARM_MIN;
                !timed || with.rate() >= without.rate()
            });
        self.decided += 1;
        let run = if pays && faster {
            // One decided round in PROBE_EVERY without the model keeps that arm measured (a
            // session the clock does not decide for has no arm to keep).
            !self.timed || !self.decided.is_multiple_of(PROBE_EVERY)
        } else {
            self.since_run[kind] + 1 >= PROBE_EVERY * b
        };
        self.since_run[kind] = if run { 0 } else { self.since_run[kind] + 1 };
        // Only the rounds of sessions that read the arms are timed into them.
        self.arm = self.timed.then_some((kind, run as usize));
        run
    }

    /// Whether the model runs this round whatever the lookups expect: a session decoding
    /// alone. [`ModelGate::run`] then needs no estimate of the lookups.
    pub fn every_round(&self) -> bool {
        self.streams <= 1
    }

    /// The model ran for `ms`; of the nodes it alone proposed `verified` were verified and
    /// `only_model` accepted.
    pub fn ran(&mut self, ms: f64, only_model: usize, verified: usize) {
        let learn = |[value, cost, nodes]: [f64; 3], fresh: bool| {
            // The pooled estimate starts from the first run, not the optimistic start.
            let value = if fresh { only_model as f64 } else { value };
            [
                ema(value, only_model as f64, 0.15).max(1e-3),
                ema(cost, ms, 0.2),
                ema(nodes, verified as f64, 0.2),
            ]
        };
        [self.value, self.cost_ms, self.nodes] =
            learn([self.value, self.cost_ms, self.nodes], false);
        self.runs += 1;
        self.arms.pooled(|p| {
            p.learned = (learn(p.learned.0, p.learned.1 == 0), p.learned.1 + 1);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A greedy session's gate in a batch of two whose estimate says the model pays (2 tokens
    /// of a 3 ms step for a 1 ms forward), timing its rounds into `arms`.
    fn paying(arms: &Arms) -> ModelGate {
        ModelGate {
            step_ms: 3.0,
            streams: 2,
            value: 2.0,
            cost_ms: 1.0,
            ..ModelGate::sharing(arms, true)
        }
    }

    /// In a batch of two, a model whose tokens are never accepted alone stops running but for
    /// probes; one whose tokens are runs every round. Rounds whose lookups expect [`ENOUGH`]
    /// nodes follow the same estimate with their own probes.
    #[test]
    fn runs_while_it_pays() {
        let mut g = ModelGate {
            step_ms: 3.0,
            streams: 2,
            ..Default::default()
        };
        assert!(g.run(0.0));
        for _ in 0..40 {
            g.ran(1.0, 0, 0);
        }
        let runs = (0..32).filter(|_| g.run(0.0)).count();
        assert_eq!(runs, 32 / (PROBE_EVERY * 2));
        assert_eq!(
            (0..32).filter(|_| g.run(ENOUGH)).count(),
            32 / (PROBE_EVERY * 2)
        );
        for _ in 0..40 {
            g.ran(1.0, 2, 2);
        }
        // Paying, it leaves one decided round in PROBE_EVERY to the lookups alone.
        assert_eq!(
            (0..32).filter(|_| g.run(0.0)).count(),
            32 - 32 / PROBE_EVERY
        );
        assert_eq!(
            (0..32).filter(|_| g.run(ENOUGH)).count(),
            32 - 32 / PROBE_EVERY
        );
    }

    /// Rounds whose lookups are strong are timed apart: a model that slows those rounds and
    /// speeds up the others runs in the others only.
    #[test]
    fn strong_lookups_are_timed_apart() {
        let mut g = paying(&Arms::default());
        let mut t = Instant::now();
        let mut runs = [0; 2];
        for round in 0..400 {
            let strong = round % 2 == 1;
            g.round_starts_at(t, false);
            let run = g.run(if strong { ENOUGH } else { 0.0 });
            if round >= 240 {
                runs[strong as usize] += run as usize;
            }
            g.committed(2);
            // The model's rounds take 2.5 ms where the lookups are weak, 4 where they are
            // strong; the lookups' own rounds 3.
            let ms = match (run, strong) {
                (false, _) => 3.0,
                (true, false) => 2.5,
                (true, true) => 4.0,
            };
            t += std::time::Duration::from_secs_f64(ms / 1e3);
        }
        // 80 rounds of each kind: the weak ones run the model but for probes, the strong
        // ones only on probes.
        assert!(runs[0] >= 80 - 80 / PROBE_EVERY - 2, "{runs:?}");
        assert!(runs[1].abs_diff(80 / (PROBE_EVERY * 2)) <= 2, "{runs:?}");
    }

    /// Rounds timed with the model and without: when the model's commit fewer tokens per ms
    /// it runs only on probes, although its tokens alone say it pays; when they commit more it
    /// runs in all decided rounds but one in PROBE_EVERY.
    #[test]
    fn the_clock_overrules_the_estimate() {
        for (model_ms, runs_every_round) in [(4.0, false), (2.5, true)] {
            let mut g = paying(&Arms::default());
            let mut t = Instant::now();
            let mut runs = 0;
            for round in 0..200 {
                g.round_starts_at(t, false);
                let run = g.run(0.0);
                if round >= 120 {
                    runs += run as usize;
                }
                g.committed(1);
                t += std::time::Duration::from_secs_f64(if run { model_ms } else { 3.0 } / 1e3);
            }
            let want = if runs_every_round {
                80 - 80 / PROBE_EVERY
            } else {
                80 / (PROBE_EVERY * 2)
            };
            assert!(
                runs.abs_diff(want) <= 1,
                "model rounds of {model_ms} ms: {runs} runs"
            );
        }
    }

    /// Tokens only the model got accepted (0.5–0.8 per run), worth about 2 ms of a 3 ms step,
    /// against a 1 ms forward: the model runs every round alone, pays at 2 streams (all but
    /// one decided round in PROBE_EVERY, which times the lookups' arm), not at 4 or 16, where
    /// it is probed every PROBE_EVERY · streams rounds.
    #[test]
    fn a_batch_raises_the_bar() {
        for (streams, pays) in [(1, true), (2, true), (4, false), (16, false)] {
            let mut g = ModelGate {
                step_ms: 3.0,
                streams,
                ..Default::default()
            };
            for _ in 0..40 {
                g.ran(1.0, 0, 0);
                g.ran(1.0, 1, 1);
                g.ran(1.0, 1, 1);
            }
            assert!((0.5..0.8).contains(&g.value), "value {}", g.value);
            let n = 64 * PROBE_EVERY;
            let runs = (0..n).filter(|_| g.run(0.0)).count();
            let want = match (streams, pays) {
                (1, _) => n,
                (_, true) => n - n / PROBE_EVERY,
                _ => n / (PROBE_EVERY * streams),
            };
            assert_eq!(runs, want, "{streams} streams");
        }
    }

    /// In a batch the model's own verify rows are charged: where a row costs what a token
    /// is worth (a compute-bound step: 16 rows of 1 ms) nodes accepted 3 times in 5 never
    /// pay, and the model runs on probes only; where rows are nearly free (0.05 ms) it runs.
    /// A new session in the batch starts from what the process's sessions learned (and
    /// sizing's step price): it does not ask the model in its first round.
    #[test]
    fn a_batch_charges_the_model_its_rows() {
        for (row_ms, pays) in [(1.0, false), (0.05, true)] {
            let arms = Arms::default();
            let mut g = ModelGate {
                streams: 16,
                step_ms: 16.0,
                row_ms,
                ..ModelGate::sharing(&arms, false)
            };
            for _ in 0..40 {
                g.ran(0.2, 3, 5);
            }
            let n = 64 * PROBE_EVERY;
            let runs = (0..n).filter(|_| g.run(0.0)).count();
            let want = if pays { n } else { n / (PROBE_EVERY * 16) };
            assert_eq!(runs, want, "rows of {row_ms} ms");
            let mut fresh = ModelGate {
                streams: 16,
                step_hint: 16.0,
                row_ms,
                ..ModelGate::sharing(&arms, false)
            };
            assert_eq!(fresh.run(0.0), pays, "a new session, rows of {row_ms} ms");
            // Alone, the clock and the sizer's cut judge the rows: the estimate does not.
            let mut alone = ModelGate {
                streams: 1,
                step_ms: 1.5,
                row_ms,
                ..ModelGate::sharing(&arms, false)
            };
            alone.ran(0.2, 3, 5);
            assert!(alone.run(0.0));
        }
    }

    /// A session alone asks its model every round, though the model's tokens are never
    /// accepted alone and its rounds are timed slower; in a batch of 4 the estimate's bar
    /// stands and it runs on probes only, or in every round once it pays.
    #[test]
    fn a_session_alone_runs_its_model_every_round() {
        let arms = Arms::default();
        let mut g = ModelGate {
            step_ms: 3.0,
            ..ModelGate::sharing(&arms, false)
        };
        for _ in 0..40 {
            g.ran(1.0, 0, 0);
        }
        let mut t = Instant::now();
        let mut runs = 0;
        for _ in 0..200 {
            g.round_starts_at(t, false);
            let run = g.run(0.0);
            runs += run as usize;
            g.committed(1);
            t += std::time::Duration::from_secs_f64(if run { 4.0 } else { 3.0 } / 1e3);
        }
        assert_eq!(runs, 200);
        g.streams = 4;
        let n = 64 * PROBE_EVERY;
        assert_eq!((0..n).filter(|_| g.run(0.0)).count(), n / (PROBE_EVERY * 4));
        // Paying in the batch it runs every round (no round is left to the lookups to time
        // them: a sampling session's arms are never read), and times nothing into the arms.
        for _ in 0..40 {
            g.ran(1.0, 2, 2);
        }
        let mut runs = 0;
        for _ in 0..64 {
            g.round_starts_at(t, false);
            runs += g.run(0.0) as usize;
            g.committed(1);
            t += std::time::Duration::from_secs_f64(3.0 / 1e3);
        }
        assert_eq!(runs, 64);
        assert!(arms.with(|a| a.iter().flatten().all(|arm| arm.rounds == 0)));
        // A greedy session's gate (timed) runs it every round alone too, and in a batch of
        // two stops running it but for probes.
        let mut timed = ModelGate {
            step_ms: 3.0,
            ..ModelGate::sharing(&arms, true)
        };
        for _ in 0..40 {
            timed.ran(1.0, 0, 0);
        }
        assert_eq!((0..32).filter(|_| timed.run(0.0)).count(), 32);
        timed.streams = 2;
        assert_eq!(
            (0..32).filter(|_| timed.run(0.0)).count(),
            32 / (PROBE_EVERY * 2)
        );
    }

    /// A session's timings reach the next session sharing its arms: the second starts with
    /// the model already measured slower, and runs it only on probes.
    #[test]
    fn sessions_share_their_timings() {
        let arms = Arms::default();
        let mut a = paying(&arms);
        let mut t = Instant::now();
        for _ in 0..120 {
            a.round_starts_at(t, false);
            let run = a.run(0.0);
            a.committed(1);
            t += std::time::Duration::from_secs_f64(if run { 4.0 } else { 3.0 } / 1e3);
        }
        let mut b = paying(&arms);
        let runs = (0..16).filter(|_| b.run(0.0)).count();
        assert_eq!(runs, 16 / (PROBE_EVERY * 2));
        let mut fresh = paying(&Arms::default());
        assert_eq!(
            (0..16).filter(|_| fresh.run(0.0)).count(),
            16 - 16 / PROBE_EVERY
        );
    }
}
