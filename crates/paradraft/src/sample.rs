//! The one sampler shared by AR decoding and speculative verification:
//! temperature → top-k → top-p, seeded and reproducible; temperature 0 is argmax with ties to
//! the lowest id.

use crate::error::{Error, Result};
use crate::runtime::ops;
use crate::types::TokenId;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables top-k.
    pub top_k: usize,
    /// 1 disables top-p.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    pub fn validate(&self) -> Result<()> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(Error::BadSampling(format!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::BadSampling(format!(
                "top-p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// A distribution over a subset of the vocabulary, sorted by probability (descending, ties by
/// lower id); probabilities sum to 1.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dist {
    pub entries: Vec<(TokenId, f32)>,
}

impl Dist {
    pub fn prob(&self, t: TokenId) -> f32 {
        // Full-vocabulary distributions are stored in id order: a direct hit.
        if let Some(&(id, p)) = self.entries.get(t.idx()) {
            if id == t {
                return p;
            }
        }
        self.entries
            .iter()
            .find(|(id, _)| *id == t)
            .map_or(0.0, |e| e.1)
    }
}

pub struct Sampler {
    pub params: SamplingParams,
    rng: ChaCha8Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        Ok(Sampler {
            params,
            rng: ChaCha8Rng::seed_from_u64(params.seed),
        })
    }

    /// A uniform draw in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.rng.next_u32() >> 8) as f32 / (1u32 << 24) as f32
    }

    /// The distribution the sampler draws from for these logits.
    pub fn dist(&self, logits: &[f32]) -> Dist {
        let p = &self.params;
        if p.is_greedy() {
            return Dist {
                entries: vec![(ops::argmax(logits), 1.0)],
            };
        }
        let k = if p.top_k == 0 {
            logits.len()
        } else {
            p.top_k.min(logits.len())
        };
        let mut cand: Vec<(TokenId, f32)> = if k < logits.len() || p.top_p < 1.0 {
            ops::top_k(logits, k)
        } else {
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (TokenId(i as u32), l))
                .collect()
        };
        let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        let inv_t = 1.0 / p.temperature;
        let mut sum = 0f64;
        for c in cand.iter_mut() {
            c.1 = ops::fast_exp((c.1 - max) * inv_t);
            sum += c.1 as f64;
        }
        for c in cand.iter_mut() {
            c.1 = (c.1 as f64 / sum) as f32;
        }
        if p.top_p < 1.0 {
            // `cand` is sorted descending: keep the smallest prefix whose mass reaches top_p.
            let mut acc = 0f32;
            let mut keep = cand.len();
            for (i, c) in cand.iter().enumerate() {
                acc += c.1;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep);
            let s: f32 = cand.iter().map(|c| c.1).sum();
            for c in cand.iter_mut() {
                c.1 /= s;
            }
        }
        Dist { entries: cand }
    }

    /// Draws from a distribution (inverse CDF over its entry order).
    pub fn draw(&mut self, d: &Dist) -> TokenId {
        if d.entries.len() == 1 {
            return d.entries[0].0;
        }
        let u = self.uniform();
        let mut acc = 0f32;
        for &(t, p) in &d.entries {
            acc += p;
            if u < acc {
                return t;
            }
        }
        d.entries
            .iter()
            .rev()
            .find(|e| e.1 > 0.0)
            .map_or(d.entries[0].0, |e| e.0)
    }

    pub fn sample(&mut self, logits: &[f32]) -> TokenId {
        let p = self.params;
        if p.is_greedy() {
            return ops::argmax(logits);
        }
        if (p.top_k == 0 || p.top_k >= logits.len()) && p.top_p >= 1.0 {
            // The full-vocabulary case of `dist` + `draw` (same weights, same order)
            // without materialising the distribution.
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let inv_t = 1.0 / p.temperature;
            let w = |l: f32| ops::fast_exp((l - max) * inv_t);
            let sum: f64 = logits.iter().map(|&l| w(l) as f64).sum();
            let target = self.uniform() as f64 * sum;
            let mut acc = 0f64;
            for (i, &l) in logits.iter().enumerate() {
                acc += w(l) as f64;
                if target < acc {
                    return TokenId(i as u32);
                }
            }
            return ops::argmax(logits);
        }
        let d = self.dist(logits);
        self.draw(&d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_params() {
        for (t, p) in [(-1.0, 1.0), (f32::NAN, 1.0), (1.0, 0.0), (1.0, 1.5)] {
            let params = SamplingParams {
                temperature: t,
                top_p: p,
                ..Default::default()
            };
            assert!(Sampler::new(params).is_err(), "{t} {p}");
        }
    }

    #[test]
    fn top_k_and_top_p_truncate() {
        let s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 3,
            top_p: 1.0,
            seed: 1,
        })
        .unwrap();
        let d = s.dist(&[0.0, 3.0, 1.0, 2.0, -1.0]);
        assert_eq!(
            d.entries.iter().map(|e| e.0 .0).collect::<Vec<_>>(),
            vec![1, 3, 2]
        );
        let s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            seed: 1,
        })
        .unwrap();
        let d = s.dist(&[0.0, 3.0, 1.0, 2.0, -1.0]);
        assert_eq!(d.entries.len(), 1);
        assert_eq!(d.entries[0].0, TokenId(1));
    }

    #[test]
    fn sampling_frequencies_follow_softmax() {
        let logits = [0.0f32, 1.0, 2.0];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            seed: 7,
            ..Default::default()
        })
        .unwrap();
        let mut counts = [0usize; 3];
        let n = 60_000;
        for _ in 0..n {
            counts[s.sample(&logits).idx()] += 1;
        }
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        for i in 0..3 {
            let want = logits[i].exp() / z;
            let got = counts[i] as f32 / n as f32;
            assert!((got - want).abs() < 0.01, "{i}: {got} vs {want}");
        }
    }

    #[test]
    fn same_seed_same_draws() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.9,
            seed: 42,
        };
        let mut a = Sampler::new(p).unwrap();
        let mut b = Sampler::new(p).unwrap();
        for _ in 0..50 {
            assert_eq!(a.sample(&logits), b.sample(&logits));
        }
    }
}
