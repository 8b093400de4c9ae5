//! How many depths a DART tree drafts. Every mask slot costs a drafter row, a head row and a
//! search level whether or not the tree's cut keeps a node there, and DART's attention is
//! causal, so fewer masks leave the shallower depths' distributions exactly as they were. A
//! depth is worth its mask while the target accepts that deep often enough: the chance of
//! accepting at least d nodes, from per-depth acceptance rates (tried when depth d − 1 was
//! accepted; Beta(1, 1) prior, so an untried depth counts at half the one above it), must be
//! at least [`WORTH`]. The rates are kept for the process's requests at one kind of
//! temperature (greedy or sampled: a sample accepts far less deep).

use crate::speculative::sizing::DepthRates;
use std::sync::{Arc, Mutex};

/// Least chance of accepting at least d nodes for depth d to be drafted: a mask row's cost
/// against a decode step's. On a 2-vCPU Xeon a DART proposal took 0.43–0.55 ms with 2 masks
/// and 0.72–0.88 ms with 7 (0.066 ms a mask) against a 2.7 ms decode step (docs/dart.md,
/// "How deep to draft").
pub const WORTH: f64 = 0.025;
/// Weight of the past in the per-depth counts (per observed round).
const DECAY: f64 = 0.99;

/// The depths worth drafting, at most `max`, by `rates`.
pub fn worth(rates: &DepthRates, max: usize) -> usize {
    rates.deepest(max, WORTH)
}

/// [`DepthRates`] shared by a process's requests: greedy ones and sampling ones apart.
#[derive(Clone, Debug)]
pub struct SharedDepths(Arc<Mutex<[DepthRates; 2]>>);

impl Default for SharedDepths {
    fn default() -> Self {
        SharedDepths(Arc::new(Mutex::new([
            DepthRates::new(DECAY),
            DepthRates::new(DECAY),
        ])))
    }
}

impl SharedDepths {
    pub fn with<R>(&self, sampled: bool, f: impl FnOnce(&mut DepthRates) -> R) -> R {
        // A poisoned lock still holds plain numbers.
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g[usize::from(sampled)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounds that accept 0, 1 or 2 nodes and never more: depth 3 is tried and dropped,
    /// depth 2 kept (a third of the rounds accept two).
    #[test]
    fn drops_depths_the_target_never_accepts() {
        let mut r = DepthRates::new(DECAY);
        assert_eq!(
            worth(&r, 8),
            5,
            "untried: half the depth above, down to WORTH"
        );
        for i in 0..300 {
            let d = worth(&r, 8);
            r.observe(d, (i % 3).min(d));
        }
        assert_eq!(worth(&r, 8), 2);
    }

    /// Rounds that accept everything drafted keep asking for one more depth, up to the cap.
    #[test]
    fn grows_while_everything_is_accepted() {
        let mut r = DepthRates::new(DECAY);
        for _ in 0..200 {
            let d = worth(&r, 7);
            r.observe(d, d);
        }
        assert_eq!(worth(&r, 7), 7);
        assert_eq!(worth(&r, 3), 3);
    }

    /// After the text turns hard (nothing accepted), depth falls to 1 and comes back
    /// when it turns easy again.
    #[test]
    fn follows_the_text() {
        let mut r = DepthRates::new(DECAY);
        for _ in 0..200 {
            let d = worth(&r, 8);
            r.observe(d, d);
        }
        for _ in 0..400 {
            let d = worth(&r, 8);
            r.observe(d, 0);
        }
        assert_eq!(worth(&r, 8), 1);
        for _ in 0..600 {
            let d = worth(&r, 8);
            r.observe(d, d);
        }
        assert_eq!(worth(&r, 8), 8);
    }

    #[test]
    fn kinds_are_kept_apart() {
        let s = SharedDepths::default();
        let t = s.clone();
        for _ in 0..300 {
            t.with(true, |r| r.observe(1, 0));
        }
        assert_eq!(s.with(true, |r| worth(r, 8)), 1);
        assert_eq!(s.with(false, |r| worth(r, 8)), 5);
    }
}
