//! [`ArpaBuilder`]: the interpolated modified Kneser–Ney estimate (KenLM's `lmplz`) of a
//! token-level 3-gram model from documents of token ids.

use super::{key2, ArpaLm, Map, LOG10_ZERO};
use crate::error::{Error, Result};
use crate::ngram::grams::Grams;
use crate::types::TokenId;

/// Counts documents of token ids and estimates an interpolated modified Kneser–Ney model.
#[derive(Default)]
pub struct ArpaBuilder {
    /// Raw trigram counts over `<s> doc </s>` (word indices: 0 `<unk>`, 1 `<s>`, 2 `</s>`,
    /// then token id + 3).
    tri: Map<(u64, u32), u32>,
    /// Raw counts of the bigrams that start with `<s>` (every other bigram has a word before
    /// it, so its continuation count comes from the trigrams).
    start_bi: Map<u32, u32>,
    max_word: u32,
}

const UNK: u32 = 0;
const BOS: u32 = 1;
const EOS: u32 = 2;

/// (D1, D2, D3+) from counts of counts t1..t4 (Chen & Goodman), or 0.5, 1, 1.5 where a
/// count-of-counts is zero or a discount falls outside (0, k).
pub(super) fn discounts(t: [u64; 4]) -> [f64; 3] {
    let fallback = [0.5, 1.0, 1.5];
    if t.contains(&0) {
        return fallback;
    }
    let t: Vec<f64> = t.iter().map(|&x| x as f64).collect();
    let y = t[0] / (t[0] + 2.0 * t[1]);
    let d: Vec<f64> = (0..3)
        .map(|k| (k + 1) as f64 - (k + 2) as f64 * y * t[k + 1] / t[k])
        .collect();
    if d.iter()
        .enumerate()
        .all(|(k, &x)| x > 0.0 && x < (k + 1) as f64)
    {
        [d[0], d[1], d[2]]
    } else {
        fallback
    }
}

fn d_of(d: &[f64; 3], c: u32) -> f64 {
    d[(c.min(3) - 1) as usize]
}

impl ArpaBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one document (it is wrapped in `<s>` … `</s>`).
    pub fn add_document(&mut self, doc: &[TokenId]) {
        let mut w: Vec<u32> = Vec::with_capacity(doc.len() + 2);
        w.push(BOS);
        w.extend(doc.iter().map(|t| t.0 + 3));
        w.push(EOS);
        self.max_word = self.max_word.max(w.iter().copied().max().unwrap_or(0));
        *self.start_bi.entry(w[1]).or_default() += 1;
        for g in w.windows(3) {
            *self.tri.entry((key2(g[0], g[1]), g[2])).or_default() += 1;
        }
    }

    /// The model (order 3).
    pub fn finish(self) -> Result<ArpaLm> {
        if self.start_bi.is_empty() {
            return Err(Error::BadRequest("no n-grams: the corpus is empty".into()));
        }
        // Adjusted counts: trigrams raw; bigrams = distinct left extensions, raw after <s>;
        // unigrams = distinct left extensions of bigrams.
        let mut a2: Map<u64, u32> = Map::default();
        for &(uv, w) in self.tri.keys() {
            let v = uv as u32;
            if v != BOS {
                *a2.entry(key2(v, w)).or_default() += 1;
            }
        }
        for (&w, &c) in &self.start_bi {
            a2.insert(key2(BOS, w), c);
        }
        let nw = self.max_word as usize + 1;
        let mut a1 = vec![0u32; nw];
        for &k in a2.keys() {
            a1[(k as u32) as usize] += 1;
        }
        let cc = |it: &mut dyn Iterator<Item = u32>| {
            let mut t = [0u64; 4];
            for c in it {
                if (1..=4).contains(&c) {
                    t[c as usize - 1] += 1;
                }
            }
            discounts(t)
        };
        let d3 = cc(&mut self.tri.values().copied());
        let d2 = cc(&mut a2.values().copied());
        let d1 = cc(&mut a1.iter().copied().filter(|&c| c > 0));
        // Unigrams: interpolated with the uniform distribution over the words that can be
        // predicted (all but <s>, <unk> included).
        let total1: f64 = a1.iter().map(|&c| c as f64).sum();
        let present: Vec<u32> = (0..nw as u32)
            .filter(|&w| w == UNK || w == EOS || (w >= 3 && a1[w as usize] > 0))
            .collect();
        let disc1: f64 = a1.iter().filter(|&&c| c > 0).map(|&c| d_of(&d1, c)).sum();
        let gamma1 = disc1 / total1;
        let uniform = 1.0 / present.len() as f64;
        let mut p1 = vec![0f64; nw];
        for &w in &present {
            let c = a1[w as usize];
            let own = if c > 0 {
                (c as f64 - d_of(&d1, c)) / total1
            } else {
                0.0
            };
            p1[w as usize] = own + gamma1 * uniform;
        }
        // Bigram contexts: Σ counts and the discounted mass (γ numerators).
        let mut ctx2: Map<u32, (f64, f64)> = Map::default();
        for (&k, &c) in &a2 {
            let e = ctx2.entry((k >> 32) as u32).or_default();
            e.0 += c as f64;
            e.1 += d_of(&d2, c);
        }
        let gamma2 = |v: u32| ctx2.get(&v).map(|e| e.1 / e.0);
        let p2 = |v: u32, w: u32| -> f64 {
            let lower = p1[w as usize];
            match ctx2.get(&v) {
                None => lower,
                Some(&(tot, disc)) => {
                    let c = a2.get(&key2(v, w)).copied().unwrap_or(0);
                    let own = if c > 0 {
                        (c as f64 - d_of(&d2, c)) / tot
                    } else {
                        0.0
                    };
                    own + disc / tot * lower
                }
            }
        };
        let mut ctx3: Map<u64, (f64, f64)> = Map::default();
        for (&(uv, _), &c) in &self.tri {
            let e = ctx3.entry(uv).or_default();
            e.0 += c as f64;
            e.1 += d_of(&d3, c);
        }
        let name = |w: u32| -> String {
            match w {
                UNK => "<unk>".into(),
                BOS => "<s>".into(),
                EOS => "</s>".into(),
                t => (t - 3).to_string(),
            }
        };
        let l10 = |p: f64| (p.log10()) as f32;
        // The model, indexed by the same word numbers.
        let mut words = vec![];
        let mut uni = vec![];
        let mut remap = vec![u32::MAX; nw];
        for w in 0..nw as u32 {
            let keep =
                w == UNK || w == BOS || w == EOS || a1[w as usize] > 0 || ctx2.contains_key(&w);
            if !keep {
                continue;
            }
            remap[w as usize] = words.len() as u32;
            words.push(name(w));
            let p = if w == BOS {
                LOG10_ZERO
            } else {
                l10(p1[w as usize])
            };
            let bo = gamma2(w).map_or(0.0, l10);
            uni.push((p, bo));
        }
        let mut bi = Vec::with_capacity(a2.len());
        for &k in a2.keys() {
            let (v, w) = ((k >> 32) as u32, k as u32);
            let bo = ctx3.get(&k).map_or(0.0, |e| l10(e.1 / e.0));
            bi.push(((remap[v as usize], remap[w as usize]), (l10(p2(v, w)), bo)));
        }
        let mut tri = Vec::with_capacity(self.tri.len());
        for (&(uv, w), &c) in &self.tri {
            let (tot, disc) = ctx3[&uv];
            let v = uv as u32;
            let p = (c as f64 - d_of(&d3, c)) / tot + disc / tot * p2(v, w);
            let u = (uv >> 32) as u32;
            tri.push((
                (remap[u as usize], remap[v as usize], remap[w as usize]),
                l10(p),
            ));
        }
        let grams = Grams::new(uni.len(), bi, tri, |i| words[i as usize].clone())
            .map_err(Error::BadRequest)?;
        let index = words
            .iter()
            .enumerate()
            .map(|(i, w)| (w.clone(), i as u32))
            .collect();
        let mut lm = ArpaLm {
            order: 3,
            words,
            index,
            unk: remap[UNK as usize],
            uni,
            grams,
            token_word: vec![],
            stamp: None,
        };
        lm.map_tokens();
        Ok(lm)
    }
}
