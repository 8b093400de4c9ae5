//! When `auto` runs its model source. The lookup sources cost microseconds; the model's
//! forward costs a good share of a decode step, so it runs only where it is likely to pay: not
//! when the lookups already propose enough, and otherwise while the tokens only it proposed
//! and the target accepted (per run, averaged) are worth more decode time than its forward
//! takes. In a batch of B streams a token of this session is worth a B-th of a step, while the
//! forward delays every stream: the bar is B times higher. When it does not pay it still runs
//! every [`PROBE_EVERY`] · B-th round, so that the estimate follows the text at a batch cost
//! that does not grow with B.

use std::time::Instant;

/// Rounds between probes of a model source that does not pay.
pub const PROBE_EVERY: usize = 8;
/// Expected accepted lookup nodes above which the model is not asked.
const ENOUGH: f64 = 1.5;

#[derive(Clone, Debug)]
pub struct ModelGate {
    /// Accepted tokens only the model proposed, per run (EMA; optimistic start).
    value: f64,
    /// The model's proposal time, ms (EMA).
    cost_ms: f64,
    /// A round without verified nodes, start to start, ms (EMA): what a token costs without
    /// drafting.
    step_ms: f64,
    since_run: usize,
    round_start: Option<Instant>,
    /// Decoding sessions sharing the next round's forward (1: alone).
    pub streams: usize,
}

impl Default for ModelGate {
    fn default() -> Self {
        ModelGate {
            value: 1.0,
            cost_ms: 0.0,
            step_ms: 0.0,
            since_run: 0,
            round_start: None,
            streams: 1,
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
    /// A round starts; `undrafted` says whether the previous one verified no node (its time
    /// was then a plain decode step).
    pub fn round_starts(&mut self, undrafted: bool) {
        let now = Instant::now();
        if let (Some(t), true) = (self.round_start, undrafted) {
            self.step_ms = ema(self.step_ms, (now - t).as_secs_f64() * 1e3, 0.2);
        }
        self.round_start = Some(now);
    }

    /// Whether to run the model this round, the lookups expecting `lookup_expected` accepted
    /// nodes. An undrafted step of `step_ms` commits one token for each of the batch's
    /// `streams`, so this session's token is worth `step_ms / streams` of the batch's time,
    /// and the forward's `cost_ms` is spent by all of them.
    pub fn run(&mut self, lookup_expected: f64) -> bool {
        if lookup_expected >= ENOUGH {
            return false;
        }
        let b = self.streams.max(1);
        let pays = self.step_ms == 0.0 || self.value * self.step_ms >= self.cost_ms * b as f64;
        let run = pays || self.since_run + 1 >= PROBE_EVERY * b;
        self.since_run = if run { 0 } else { self.since_run + 1 };
        run
    }

    /// The model ran for `ms` and `only_model` accepted tokens came from it alone.
    pub fn ran(&mut self, ms: f64, only_model: usize) {
        self.cost_ms = ema(self.cost_ms, ms, 0.2);
        self.value = ema(self.value, only_model as f64, 0.15).max(1e-3);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model whose tokens are never accepted alone stops running but for probes; one whose
    /// tokens are runs every round; enough lookup nodes skip it.
    #[test]
    fn runs_while_it_pays() {
        let mut g = ModelGate {
            step_ms: 3.0,
            ..Default::default()
        };
        assert!(g.run(0.0));
        for _ in 0..40 {
            g.ran(1.0, 0);
        }
        let runs = (0..32).filter(|_| g.run(0.0)).count();
        assert_eq!(runs, 32 / PROBE_EVERY);
        for _ in 0..40 {
            g.ran(1.0, 2);
        }
        assert_eq!((0..32).filter(|_| g.run(0.0)).count(), 32);
        assert!(!g.run(ENOUGH));
    }

    /// Tokens only the model got accepted (0.5–0.8 per run), worth about 2 ms of a 3 ms step,
    /// against a 1 ms forward: the model pays alone and at 2 streams, not at 4 or 16, where it
    /// is probed every PROBE_EVERY · streams rounds.
    #[test]
    fn a_batch_raises_the_bar() {
        for (streams, every_round) in [(1, true), (2, true), (4, false), (16, false)] {
            let mut g = ModelGate {
                step_ms: 3.0,
                streams,
                ..Default::default()
            };
            for _ in 0..40 {
                g.ran(1.0, 0);
                g.ran(1.0, 1);
                g.ran(1.0, 1);
            }
            assert!((0.5..0.8).contains(&g.value), "value {}", g.value);
            let n = 64 * PROBE_EVERY;
            let runs = (0..n).filter(|_| g.run(0.0)).count();
            let want = if every_round {
                n
            } else {
                n / (PROBE_EVERY * streams)
            };
            assert_eq!(runs, want, "{streams} streams");
        }
    }
}
