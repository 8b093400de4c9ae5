//! The one sampler shared by AR decoding, speculative verification and drafters:
//! temperature → top-k → min-p → top-p; temperature 0 is argmax with ties to the lowest id. Draws are
//! keyed by (seed, position), so the token a seed gives at a position is fixed before any
//! logits are computed ([`Noise`]).

use crate::error::{Error, Result};
use crate::runtime::{multiversion, ops};
use crate::types::TokenId;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables top-k.
    pub top_k: usize,
    /// 1 disables top-p.
    pub top_p: f32,
    /// Tokens less probable than `min_p` × the most probable one (after temperature) are
    /// dropped; 0 disables min-p.
    pub min_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
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
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(Error::BadSampling(format!(
                "min-p must be in [0, 1], got {}",
                self.min_p
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

/// Randomness as a pure function of (seed, absolute position, stream, token id), never of how
/// many numbers were drawn before: a run reproduces whatever was drafted, however the drafts
/// were sized, and on any number of threads.
///
/// Stream [`Noise::TOKEN`] holds the Gumbel noise that *is* the token at a position: AR sampling
/// takes argmax(log p + G), and so does every verification under
/// [`crate::speculative::verify::VerifyRule::Coupled`]. Other streams are uniforms for the rejection
/// rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Noise {
    seed: u64,
}

/// One (seed, position, stream) cell of [`Noise`]: per-token Gumbel noise and one uniform.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoiseKey(u64);

/// The splitmix64 finaliser (a bijection with full avalanche).
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A 32-bit avalanche round (lowbias32).
#[inline(always)]
fn mix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x7feb_352d);
    h ^= h >> 15;
    h = h.wrapping_mul(0x846c_a68b);
    h ^ (h >> 16)
}

/// 23 bits of `h` as a uniform in (0, 1): (k + ½)·2⁻²³ is exact in f32 and never 0 or 1, so
/// both logarithms of the Gumbel transform are finite.
#[inline(always)]
fn unit(h: u32) -> f32 {
    ((h >> 9) as f32 + 0.5) * (1.0 / (1u32 << 23) as f32)
}

impl Noise {
    /// The stream whose Gumbel noise decides each position's token.
    pub const TOKEN: u32 = 0;
    /// The stream of rejection-rule bonus draws; streams 1.. are acceptance tests by child.
    pub const RESIDUAL: u32 = u32::MAX;
    /// The rejection rules' draws from p where nothing was drafted. Never [`Noise::TOKEN`]:
    /// drafters may read that stream (Gumbel coupling), so what they drafted — and whether
    /// they drafted at all — can depend on it.
    pub const FREE: u32 = u32::MAX - 1;

    pub fn new(seed: u64) -> Noise {
        Noise { seed }
    }

    pub fn key(&self, pos: usize, stream: u32) -> NoiseKey {
        NoiseKey(mix64(
            mix64(self.seed ^ 0x5851_f42d_4c95_7f2d) ^ ((pos as u64) << 32 | stream as u64),
        ))
    }
}

impl NoiseKey {
    /// A uniform draw in (0, 1).
    pub fn uniform(self) -> f32 {
        unit(mix32(self.0 as u32 ^ mix32((self.0 >> 32) as u32)))
    }

    /// Standard Gumbel noise for token `id`.
    #[inline(always)]
    pub fn gumbel(self, id: u32) -> f32 {
        let h = mix32(mix32(id ^ self.0 as u32) ^ (self.0 >> 32) as u32);
        -ops::fast_ln(-ops::fast_ln(unit(h)))
    }

    /// argmax over `entries` of log p + Gumbel: a draw from the distribution (Gumbel-max).
    pub fn pick(self, d: &Dist) -> TokenId {
        pick_entries(&d.entries, self)
    }
}

multiversion! {
    /// argmax over entries with p > 0 of ln p + gumbel(id), 16 entries at a time; ties (of
    /// measure zero) go to the earliest entry.
    fn pick_entries(entries: &[(TokenId, f32)], key: NoiseKey) -> TokenId {
        let score = |e: &(TokenId, f32)| {
            let s = ops::fast_ln(e.1) + key.gumbel(e.0 .0);
            if e.1 > 0.0 { s } else { f32::NEG_INFINITY }
        };
        let mut best = [f32::NEG_INFINITY; 16];
        let mut at = [usize::MAX; 16];
        let mut ch = entries.chunks_exact(16);
        let mut base = 0;
        for c in &mut ch {
            for l in 0..16 {
                let s = score(&c[l]);
                if s > best[l] {
                    best[l] = s;
                    at[l] = base + l;
                }
            }
            base += 16;
        }
        let (mut b, mut a) = (f32::NEG_INFINITY, usize::MAX);
        for l in 0..16 {
            if best[l] > b || (best[l] == b && at[l] < a) {
                (b, a) = (best[l], at[l]);
            }
        }
        for (i, e) in ch.remainder().iter().enumerate() {
            let s = score(e);
            if s > b {
                (b, a) = (s, base + i);
            }
        }
        entries.get(a).or(entries.first()).map_or(TokenId(0), |e| e.0)
    }
}

multiversion! {
    /// argmax over the vocabulary of `logits[v] · inv_t + gumbel(v)`, 16 lanes at a time; ties
    /// (of measure zero) go to the lowest id.
    fn gumbel_argmax(logits: &[f32], inv_t: f32, key: NoiseKey) -> TokenId {
        let mut best = [f32::NEG_INFINITY; 16];
        let mut at = [0u32; 16];
        let mut ch = logits.chunks_exact(16);
        let mut base = 0u32;
        for c in &mut ch {
            for l in 0..16 {
                let s = c[l] * inv_t + key.gumbel(base + l as u32);
                if s > best[l] {
                    best[l] = s;
                    at[l] = base + l as u32;
                }
            }
            base += 16;
        }
        let (mut b, mut a) = (f32::NEG_INFINITY, 0u32);
        for l in 0..16 {
            if best[l] > b || (best[l] == b && at[l] < a) {
                (b, a) = (best[l], at[l]);
            }
        }
        for (i, &v) in ch.remainder().iter().enumerate() {
            let s = v * inv_t + key.gumbel(base + i as u32);
            if s > b {
                (b, a) = (s, base + i as u32);
            }
        }
        TokenId(a)
    }
}

multiversion! {
    /// `out[v] = logits[v] · inv_t + gumbel(v)`: each id's Gumbel-max score.
    fn perturbed(logits: &[f32], inv_t: f32, key: NoiseKey, out: &mut [f32]) {
        for (v, (o, &l)) in out.iter_mut().zip(logits).enumerate() {
            *o = l * inv_t + key.gumbel(v as u32);
        }
    }
}

thread_local! {
    /// Per-thread buffers of [`Sampler::sample_rescored`]: a row's scores, candidate ids.
    static SCORES: std::cell::RefCell<(Vec<f32>, Vec<u32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Lowest temperature at which plain sampling re-scores ([`Sampler::rescores`]): candidates
/// lie within `margin / T` of a row's best score, and on a flat row about e^(margin / T) ids
/// do (at a 4-bit screen's margin of 4: ~55 at T = 1, ~300 at 0.7, ~800 at 0.6), each
/// re-scored alone.
pub const RESCORED_MIN_T: f32 = 0.6;

/// The target's sampler: its distribution (temperature → top-k → top-p) and keyed draws from
/// it. It holds no state: the same (logits, position) always give the same token.
#[derive(Clone, Copy, Debug)]
pub struct Sampler {
    pub params: SamplingParams,
    pub noise: Noise,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        Ok(Sampler {
            params,
            noise: Noise::new(params.seed),
        })
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
        if k == logits.len() && p.top_p < 1.0 && p.min_p == 0.0 {
            return self.nucleus(logits);
        }
        let cand: Vec<(TokenId, f32)> = if k < logits.len() || p.top_p < 1.0 || p.min_p > 0.0 {
            ops::top_k(logits, k)
        } else {
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (TokenId(i as u32), l))
                .collect()
        };
        self.normalise(cand)
    }

    /// Top-p alone over a whole row without sorting it: the mass is normalised over the whole
    /// vocabulary, and the best 64, 512, 4096, … ids are taken until the nucleus ends inside them
    /// (with a full sort of SmolLM2's 49,152 logits a token, AR decode at T 0.7, top-p 0.9 ran
    /// 151–159 tok/s, without it 238 on a 2-vCPU Xeon).
    fn nucleus(&self, logits: &[f32]) -> Dist {
        let inv_t = 1.0 / self.params.temperature;
        let max = ops::max_value(logits);
        let total: f64 = logits
            .iter()
            .map(|&l| ops::fast_exp((l - max) * inv_t) as f64)
            .sum();
        let mut k = 64;
        loop {
            let d = self.normalise_of(ops::top_k(logits, k), Some(total));
            // Fewer kept than taken: the nucleus ended inside them.
            if d.entries.len() < k || k >= logits.len() {
                return d;
            }
            k *= 8;
        }
    }

    /// Temperature, then min-p, then top-p over `cand` (logits; sorted best first whenever
    /// top-p < 1 or min-p > 0).
    fn normalise(&self, cand: Vec<(TokenId, f32)>) -> Dist {
        self.normalise_of(cand, None)
    }

    /// [`Sampler::normalise`] with the softmax's denominator `total` (the sum of
    /// exp((l − max) / T) over a whole row whose best ids `cand` are) instead of `cand`'s own.
    fn normalise_of(&self, mut cand: Vec<(TokenId, f32)>, total: Option<f64>) -> Dist {
        let p = &self.params;
        let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        let inv_t = 1.0 / p.temperature;
        let mut sum = 0f64;
        for c in cand.iter_mut() {
            c.1 = ops::fast_exp((c.1 - max) * inv_t);
            sum += c.1 as f64;
        }
        let sum = total.unwrap_or(sum);
        for c in cand.iter_mut() {
            c.1 = (c.1 as f64 / sum) as f32;
        }
        if p.min_p > 0.0 {
            // Sorted descending: the first is the most probable.
            let floor = cand.first().map_or(0.0, |c| c.1) * p.min_p;
            let keep = cand.iter().take_while(|c| c.1 >= floor).count().max(1);
            cand.truncate(keep);
            let s: f32 = cand.iter().map(|c| c.1).sum();
            for c in cand.iter_mut() {
                c.1 /= s;
            }
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

    /// A drafter's candidates for absolute position `pos` as the coupled rule sees them
    /// ([`crate::speculative::VerifyRule::Coupled`]): `cand` holds target ids with the
    /// drafter's logits, best first; under this sampler's transform (temperature → top-k →
    /// top-p, within the candidates) each is scored ln q(x) + G(x) with the target's own
    /// Gumbel noise at `pos`, and they come back best score first. The best is the drafter's
    /// Gumbel-coupled pick ([`Sampler::pick_at`] over the candidates): the target's own sample
    /// if its distribution were q. Softmax of the scores is each candidate's chance of being
    /// that sample when the target's log-probabilities differ from the drafter's by Gumbel
    /// error. At temperature 0 the candidates come back as they are.
    pub fn coupled(&self, mut cand: Vec<(TokenId, f32)>, pos: usize) -> Vec<(TokenId, f32)> {
        let p = &self.params;
        if p.is_greedy() || cand.is_empty() {
            return cand;
        }
        if p.top_k > 0 {
            cand.truncate(p.top_k);
        }
        let key = self.noise.key(pos, Noise::TOKEN);
        let mut out: Vec<(TokenId, f32)> = self
            .normalise(cand)
            .entries
            .into_iter()
            .filter(|e| e.1 > 0.0)
            .map(|(t, q)| (t, ops::fast_ln(q) + key.gumbel(t.0)))
            .collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        out
    }

    /// The token at absolute position `pos` given the logits that predict it: argmax at
    /// temperature 0, else Gumbel-max with the position's [`Noise::TOKEN`] noise — a draw from
    /// [`Sampler::dist`] that is fixed before the logits are known.
    pub fn sample_at(&self, logits: &[f32], pos: usize) -> TokenId {
        self.sample_keyed(logits, self.noise.key(pos, Noise::TOKEN))
    }

    /// [`Sampler::sample_at`] with the noise of `key` (a rejection rule's own draws).
    pub fn sample_keyed(&self, logits: &[f32], key: NoiseKey) -> TokenId {
        let p = self.params;
        if p.is_greedy() {
            return ops::argmax(logits);
        }
        if (p.top_k == 0 || p.top_k >= logits.len()) && p.top_p >= 1.0 && p.min_p == 0.0 {
            // Full vocabulary: log p = logits / T − const, so the distribution need not be built.
            return gumbel_argmax(logits, 1.0 / p.temperature, key);
        }
        key.pick(&self.dist(logits))
    }

    /// Whether this sampler's draws can be made from approximate rows re-scored near the
    /// top ([`Sampler::sample_rescored`]): the distribution must depend on a few ids' exact
    /// values only — plain temperature sampling at [`RESCORED_MIN_T`] or above, or any
    /// sampling with top-k or min-p (which keep the ids near the top; top-p alone reads
    /// every probability).
    pub fn rescores(&self) -> bool {
        let p = &self.params;
        !p.is_greedy()
            && (p.top_k > 0 || p.min_p > 0.0 || (p.top_p >= 1.0 && p.temperature >= RESCORED_MIN_T))
    }

    /// [`Sampler::sample_at`] over a row of approximate logits (the 4-bit screen's, or int8
    /// activations') whose exact values come from `exact` and lie within `margin / 2` of
    /// them: only ids that may matter are re-scored, and the draw is the one `sample_at`
    /// makes on the exact row. Plain temperature: the ids whose Gumbel-max score lies within
    /// `margin / T` of the row's best (the exact winner's approximate score is at most that
    /// below it), the best exact score winning. Top-k / min-p: the ids within `margin` of
    /// the k-th value or of min-p's floor (every id the exact cut keeps), whose exact values
    /// then make the distribution. For [`Sampler::rescores`] samplers; others draw from `row`
    /// as it is.
    pub fn sample_rescored(
        &self,
        row: &[f32],
        pos: usize,
        exact: impl Fn(TokenId) -> f32,
        margin: f32,
    ) -> TokenId {
        let key = self.noise.key(pos, Noise::TOKEN);
        let p = &self.params;
        if !self.rescores() {
            return self.sample_keyed(row, key);
        }
        let inv_t = 1.0 / p.temperature;
        SCORES.with_borrow_mut(|(scores, cand)| {
            cand.clear();
            let all = p.top_k == 0 || p.top_k >= row.len();
            if all && p.min_p == 0.0 && p.top_p >= 1.0 {
                scores.resize(row.len(), 0.0);
                perturbed(row, inv_t, key, scores);
                let cut = ops::max_value(scores) - margin * inv_t;
                ops::indices_at_least(scores, cut, cand);
                // Ascending ids, so ties (of measure zero) go to the lowest, as in `sample_at`.
                let (mut best, mut at) = (f32::NEG_INFINITY, None);
                for &id in cand.iter() {
                    let s = exact(TokenId(id)) * inv_t + key.gumbel(id);
                    if s > best || at.is_none() {
                        (best, at) = (s, Some(id));
                    }
                }
                return at.map_or_else(|| gumbel_argmax(row, inv_t, key), TokenId);
            }
            // (Neither cut — a top-k of the whole vocabulary with top-p — re-scores every id.)
            let mut cut = f32::NEG_INFINITY;
            if !all {
                cut = ops::top_k(row, p.top_k).last().map_or(cut, |e| e.1) - margin;
            }
            if p.min_p > 0.0 {
                // Kept: p ≥ min_p · p_max, i.e. a logit ≥ the best + T · ln(min_p).
                cut = cut.max(ops::max_value(row) + p.temperature * p.min_p.ln() - margin);
            }
            ops::indices_at_least(row, cut, cand);
            let mut c: Vec<(TokenId, f32)> = cand
                .iter()
                .map(|&id| (TokenId(id), exact(TokenId(id))))
                .collect();
            // As `ops::top_k` orders them: best first, ties to the lower id.
            c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            if p.top_k > 0 {
                c.truncate(p.top_k);
            }
            key.pick(&self.normalise(c))
        })
    }

    /// A draw from `d` (any distribution over target ids, e.g. a drafter's q) with the noise of
    /// position `pos`: the same noise the target samples with, so that a drafter whose q is
    /// close to p proposes the target's own token (Gumbel coupling).
    pub fn pick_at(&self, d: &Dist, pos: usize) -> TokenId {
        self.noise.key(pos, Noise::TOKEN).pick(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// min-p keeps the tokens at least min-p × as probable as the best (after temperature),
    /// renormalised; 1 keeps only the best; it never empties the distribution.
    #[test]
    fn min_p_drops_the_improbable_tail() {
        let logits = [2.0f32, 1.0, 0.0, -3.0];
        let z: f32 = logits.iter().map(|x| x.exp()).sum();
        let p: Vec<f32> = logits.iter().map(|x| x.exp() / z).collect();
        let s = |min_p| {
            Sampler::new(SamplingParams {
                temperature: 1.0,
                min_p,
                ..Default::default()
            })
            .unwrap()
        };
        // 0.2 × p0: p1 (e^-1 ≈ 0.37 of p0) stays, p2 (0.135) and p3 go.
        let d = s(0.2).dist(&logits);
        let ids: Vec<u32> = d.entries.iter().map(|e| e.0 .0).collect();
        assert_eq!(ids, vec![0, 1]);
        let want = p[0] / (p[0] + p[1]);
        assert!((d.entries[0].1 - want).abs() < 1e-3, "{d:?}");
        assert_eq!(s(1.0).dist(&logits).entries.len(), 1);
        assert_eq!(s(0.0).dist(&logits).entries.len(), 4);
        // Draws come only from the kept tokens.
        let s2 = s(0.2);
        for pos in 0..500 {
            assert!(s2.sample_at(&logits, pos).0 < 2);
        }
        assert!(SamplingParams {
            min_p: 1.5,
            ..Default::default()
        }
        .validate()
        .is_err());
    }

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
            min_p: 0.0,
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
            min_p: 0.0,
            seed: 1,
        })
        .unwrap();
        let d = s.dist(&[0.0, 3.0, 1.0, 2.0, -1.0]);
        assert_eq!(d.entries.len(), 1);
        assert_eq!(d.entries[0].0, TokenId(1));
    }

    /// Top-p over a long row (the best ids taken in growing sets, not a sort of the row) keeps
    /// the ids and probabilities of the definition: the smallest best-first prefix holding
    /// top-p of the whole row's mass, renormalised. A peaked row ends inside the first 64; a
    /// flat one needs thousands.
    #[test]
    fn top_p_keeps_the_nucleus_of_the_whole_row() {
        let mut x = 7u32;
        let mut unif = || {
            x = x.wrapping_mul(1664525).wrapping_add(1013904223);
            (x >> 8) as f32 / (1u32 << 24) as f32
        };
        let peaked: Vec<f32> = (0..20_000).map(|_| unif() * 12.0 - 6.0).collect();
        let flat: Vec<f32> = (0..20_000).map(|_| unif() * 0.5).collect();
        for row in [&peaked, &flat] {
            for top_p in [0.3f32, 0.9, 0.99] {
                let s = Sampler::new(SamplingParams {
                    temperature: 0.8,
                    top_p,
                    ..Default::default()
                })
                .unwrap();
                let got = s.dist(row);
                let mut idx: Vec<usize> = (0..row.len()).collect();
                idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
                let w: Vec<f64> = idx.iter().map(|&i| ((row[i] / 0.8) as f64).exp()).collect();
                let z: f64 = w.iter().sum();
                let mut acc = 0.0;
                let keep = w.iter().take_while(|&&v| {
                    let before = acc;
                    acc += v / z;
                    before < top_p as f64
                });
                let n = keep.count();
                let kept: f64 = w[..n].iter().sum();
                assert!(
                    (got.entries.len() as i64 - n as i64).abs() <= 1,
                    "{top_p}: {} vs {n}",
                    got.entries.len()
                );
                for (e, (&i, &v)) in got.entries.iter().zip(idx.iter().zip(&w)) {
                    assert_eq!(e.0.idx(), i);
                    assert!(
                        (e.1 as f64 - v / kept).abs() < 1e-3 / n as f64 + 1e-6,
                        "{top_p}"
                    );
                }
            }
        }
        assert!(
            Sampler::new(SamplingParams {
                temperature: 0.8,
                top_p: 0.99,
                ..Default::default()
            })
            .unwrap()
            .dist(&flat)
            .entries
            .len()
                > 4096
        );
    }

    /// Frequencies of `draw(pos)` over positions 0..n against `want`, ±0.01 per token.
    fn assert_frequencies(mut draw: impl FnMut(usize) -> TokenId, want: &[f32]) {
        let mut counts = vec![0usize; want.len()];
        let n = 60_000;
        for pos in 0..n {
            counts[draw(pos).idx()] += 1;
        }
        for (i, w) in want.iter().enumerate() {
            let got = counts[i] as f32 / n as f32;
            assert!((got - w).abs() < 0.01, "{i}: {got} vs {w}");
        }
    }

    fn softmax(l: &[f32], t: f32) -> Vec<f32> {
        let z: f32 = l.iter().map(|x| (x / t).exp()).sum();
        l.iter().map(|x| (x / t).exp() / z).collect()
    }

    /// With the target's own logits as the drafter's, the best coupled candidate is the
    /// target's sample at every position (temperature 0.7, with and without top-k); scores
    /// come best first.
    #[test]
    fn coupled_candidates_lead_with_the_targets_sample() {
        let logits: Vec<f32> = (0..40).map(|i| ((i * 7) % 11) as f32 * 0.4).collect();
        let cand = ops::top_k(&logits, logits.len());
        for top_k in [0, 5] {
            let s = Sampler::new(SamplingParams {
                temperature: 0.7,
                top_k,
                seed: 3,
                ..Default::default()
            })
            .unwrap();
            for pos in 0..2_000 {
                let c = s.coupled(cand.clone(), pos);
                assert_eq!(c[0].0, s.sample_at(&logits, pos), "top-k {top_k} pos {pos}");
                assert!(c.windows(2).all(|w| w[0].1 >= w[1].1));
                assert_eq!(c.len(), if top_k > 0 { top_k } else { logits.len() });
            }
        }
        let greedy = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(greedy.coupled(cand.clone(), 9), cand);
    }

    #[test]
    fn uniforms_stay_inside_the_open_interval() {
        for h in [0u32, 511, 512, u32::MAX - 512, u32::MAX] {
            let u = unit(h);
            assert!(u > 0.0 && u < 1.0, "{h}: {u}");
            let g = -ops::fast_ln(-ops::fast_ln(u));
            assert!(g.is_finite() && g.abs() < 17.0, "{h}: {g}");
        }
    }

    #[test]
    fn keyed_gumbel_draws_follow_softmax() {
        // 40 logits: the 16-lane loop and its remainder both take part.
        let logits: Vec<f32> = (0..40).map(|i| ((i * 7) % 11) as f32 * 0.3).collect();
        for (t, seed) in [(1.0, 7), (0.5, 8)] {
            let s = Sampler::new(SamplingParams {
                temperature: t,
                seed,
                ..Default::default()
            })
            .unwrap();
            let want = softmax(&logits, t);
            assert_frequencies(|pos| s.sample_at(&logits, pos), &want);
            // The same noise through an explicit distribution (drafters' path).
            let d = s.dist(&logits);
            assert_frequencies(|pos| s.pick_at(&d, pos), &want);
        }
        // Top-k: the draw stays inside the top 3, renormalised.
        let s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 3,
            top_p: 1.0,
            min_p: 0.0,
            seed: 9,
        })
        .unwrap();
        let l = [0.0f32, 3.0, 1.0, 2.0, -1.0];
        let top = softmax(&[3.0, 2.0, 1.0], 1.0);
        assert_frequencies(
            |pos| s.sample_at(&l, pos),
            &[0.0, top[0], top[2], top[1], 0.0],
        );
    }

    /// Consecutive positions are independent: the joint of two draws is the product.
    #[test]
    fn keyed_draws_are_independent_across_positions_and_seeds() {
        let l = [0.0f32, 0.7, 1.1];
        let p = softmax(&l, 1.0);
        let mut joint = [[0usize; 3]; 3];
        let n = 90_000;
        for i in 0..n {
            let s = Sampler::new(SamplingParams {
                temperature: 1.0,
                seed: i as u64 / 100,
                ..Default::default()
            })
            .unwrap();
            let pos = (i % 100) * 2;
            joint[s.sample_at(&l, pos).idx()][s.sample_at(&l, pos + 1).idx()] += 1;
        }
        let mut chi = 0.0;
        for a in 0..3 {
            for b in 0..3 {
                let e = (p[a] * p[b]) as f64 * n as f64;
                chi += (joint[a][b] as f64 - e).powi(2) / e;
            }
        }
        // 8 degrees of freedom: the 0.1 % point is 26.1.
        assert!(chi < 26.1, "χ² = {chi:.1}: {joint:?}");
    }

    #[test]
    fn same_seed_and_position_same_token() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.0,
            seed: 42,
        };
        let (a, b) = (Sampler::new(p).unwrap(), Sampler::new(p).unwrap());
        let other = Sampler::new(SamplingParams { seed: 43, ..p }).unwrap();
        let mut differ = 0;
        for pos in 0..50 {
            assert_eq!(a.sample_at(&logits, pos), b.sample_at(&logits, pos));
            differ += (a.sample_at(&logits, pos) != other.sample_at(&logits, pos)) as usize;
        }
        assert!(
            differ > 10,
            "another seed gives other tokens ({differ} of 50 differ)"
        );
    }
}
