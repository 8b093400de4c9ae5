//! The draft vocabulary shared by every drafter with a reduced LM head (EAGLE-3's convention,
//! used by DART and by our DFlash checkpoints): draft id `i` is target id `i + d2t[i]`, stored
//! as an I64 tensor `d2t` of offsets. One type serves loading, decoding and training.

use crate::error::{Error, Result};
use crate::model::source::{SafetensorsSource, TensorSource};
use crate::types::Sample;
use crate::types::TokenId;

/// Maps draft ids to target ids and back (the identity when the drafter scores the whole
/// target vocabulary).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraftVocab {
    /// Target id of each draft id.
    pub d2t: Vec<u32>,
    /// Draft id of each target id, `u32::MAX` when absent.
    t2d: Vec<u32>,
}

impl DraftVocab {
    /// The whole target vocabulary.
    pub fn full(n: usize) -> Self {
        DraftVocab {
            d2t: (0..n as u32).collect(),
            t2d: (0..n as u32).collect(),
        }
    }

    /// From the target id of each draft id (each below `vocab`).
    pub fn from_d2t(d2t: Vec<u32>, vocab: usize) -> Self {
        let mut t2d = vec![u32::MAX; vocab];
        for (d, &t) in d2t.iter().enumerate() {
            t2d[t as usize] = d as u32;
        }
        DraftVocab { t2d, d2t }
    }

    /// From EAGLE-3 offsets (`target = draft + offset`); every target id must lie in
    /// `0..vocab` and appear once.
    pub fn from_offsets(offsets: &[i64], vocab: usize) -> std::result::Result<Self, String> {
        let mut seen = vec![false; vocab];
        let mut d2t = Vec::with_capacity(offsets.len());
        for (i, &o) in offsets.iter().enumerate() {
            let t = i as i64 + o;
            if !(0..vocab as i64).contains(&t) {
                return Err(format!(
                    "d2t[{i}] maps to {t}, outside the vocabulary of {vocab}"
                ));
            }
            if std::mem::replace(&mut seen[t as usize], true) {
                return Err(format!("d2t maps two draft ids to target id {t}"));
            }
            d2t.push(t as u32);
        }
        Ok(Self::from_d2t(d2t, vocab))
    }

    /// The offsets to store as `d2t`.
    pub fn offsets(&self) -> Vec<i64> {
        self.d2t
            .iter()
            .enumerate()
            .map(|(i, &t)| t as i64 - i as i64)
            .collect()
    }

    /// A checkpoint's draft vocabulary: its `d2t` tensor when `size` (the config's
    /// `draft_vocab_size`) is set, else the whole target vocabulary. `what` names the format
    /// in errors.
    pub fn load(
        src: &SafetensorsSource,
        size: Option<usize>,
        vocab: usize,
        what: &'static str,
    ) -> Result<Self> {
        let Some(n) = size else {
            return Ok(Self::full(vocab));
        };
        let bad = |reason: String| Error::BadModelFile {
            path: src.describe().into(),
            format: what,
            reason,
        };
        let d2t = src
            .int_tensor("d2t")
            .ok_or_else(|| bad("draft_vocab_size is set but tensor d2t is missing".into()))?;
        if d2t.len() != n {
            return Err(bad(format!("d2t has {} entries, expected {n}", d2t.len())));
        }
        Self::from_offsets(&d2t, vocab).map_err(bad)
    }

    /// The `size` most frequent tokens of `samples` (responses count twice, prompts once,
    /// since drafts often copy from the prompt); ties and unseen ids go to the lower id, which
    /// in a BPE vocabulary is the earlier, more frequent merge. Kept in ascending id order.
    pub fn most_frequent(samples: &[Sample], vocab: usize, size: usize) -> Self {
        let mut count = vec![0u64; vocab];
        for s in samples {
            let (p, r) = s.tokens.split_at(s.prompt_len as usize);
            for t in p {
                count[t.idx()] += 1;
            }
            for t in r {
                count[t.idx()] += 2;
            }
        }
        let mut ids: Vec<u32> = (0..vocab as u32).collect();
        ids.sort_by(|&a, &b| count[b as usize].cmp(&count[a as usize]).then(a.cmp(&b)));
        ids.truncate(size.min(vocab));
        ids.sort_unstable();
        Self::from_d2t(ids, vocab)
    }

    pub fn len(&self) -> usize {
        self.d2t.len()
    }

    pub fn is_empty(&self) -> bool {
        self.d2t.is_empty()
    }

    /// Size of the target vocabulary it maps into.
    pub fn target_len(&self) -> usize {
        self.t2d.len()
    }

    /// Whether it is the whole target vocabulary in target order.
    pub fn is_full(&self) -> bool {
        self.d2t.len() == self.t2d.len()
    }

    /// The target token of a draft id.
    pub fn target_id(&self, draft: usize) -> TokenId {
        TokenId(self.d2t[draft])
    }

    /// The draft id of a target token, if the draft vocabulary has it.
    pub fn draft_id(&self, t: TokenId) -> Option<u32> {
        self.t2d.get(t.idx()).copied().filter(|&d| d != u32::MAX)
    }

    /// Fraction of the response tokens of `samples` inside this vocabulary.
    pub fn coverage(&self, samples: &[Sample]) -> f64 {
        let (mut hit, mut all) = (0usize, 0usize);
        for s in samples {
            for &t in &s.tokens[s.prompt_len as usize..] {
                all += 1;
                hit += self.draft_id(t).is_some() as usize;
            }
        }
        hit as f64 / all.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_round_trip_and_bad_maps_are_refused() {
        let v = DraftVocab::from_d2t(vec![0, 2, 5, 7], 8);
        assert_eq!(v.offsets(), vec![0, 1, 3, 4]);
        assert_eq!(DraftVocab::from_offsets(&v.offsets(), 8).unwrap(), v);
        assert_eq!(v.draft_id(TokenId(5)), Some(2));
        assert_eq!(v.draft_id(TokenId(1)), None);
        assert_eq!(v.target_id(3), TokenId(7));
        assert!(!v.is_full() && DraftVocab::full(8).is_full());
        assert!(DraftVocab::from_offsets(&[0, 7], 8).is_err()); // 1 + 7 = 8
        assert!(DraftVocab::from_offsets(&[1, 0], 8).is_err()); // both map to 1
        assert!(DraftVocab::from_offsets(&[-1], 8).is_err());
    }
}
