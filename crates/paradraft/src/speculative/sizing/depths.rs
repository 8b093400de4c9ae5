//! Per-depth acceptance rates, decayed: what the chain sizer prices drafts with and what a
//! block drafter learns its depth from.

/// `tried[d - 1]`: rounds that drafted depth d with depth d − 1 accepted; `hit[d - 1]`: those
/// that had depth d accepted too. Both decay by `decay` per observed round.
#[derive(Clone, Debug)]
pub struct DepthRates {
    tried: Vec<f64>,
    hit: Vec<f64>,
    decay: f64,
}

impl DepthRates {
    pub fn new(decay: f64) -> Self {
        DepthRates {
            tried: vec![],
            hit: vec![],
            decay,
        }
    }

    /// A round that drafted `depth` levels and had `accepted` nodes accepted.
    pub fn observe(&mut self, depth: usize, accepted: usize) {
        if self.tried.len() < depth {
            self.tried.resize(depth, 0.0);
            self.hit.resize(depth, 0.0);
        }
        for v in self.tried.iter_mut().chain(self.hit.iter_mut()) {
            *v *= self.decay;
        }
        for d in 1..=depth.min(accepted + 1) {
            self.tried[d - 1] += 1.0;
            if d <= accepted {
                self.hit[d - 1] += 1.0;
            }
        }
    }

    /// Acceptance rate at depth d (≥ 1) given depth d − 1 accepted, with a Beta(1, 1) prior.
    pub fn rate(&self, d: usize) -> f64 {
        let t = self.tried.get(d - 1).copied().unwrap_or(0.0);
        let h = self.hit.get(d - 1).copied().unwrap_or(0.0);
        (h + 1.0) / (t + 2.0)
    }

    /// The deepest d ≤ `max` (at least 1) whose chance of at least d accepted nodes, the
    /// product of the rates down to it, is `least` or more.
    pub fn deepest(&self, max: usize, least: f64) -> usize {
        let (mut reach, mut depth) = (1.0, 1);
        for d in 1..=max {
            reach *= self.rate(d);
            if reach < least {
                break;
            }
            depth = d;
        }
        depth
    }
}
