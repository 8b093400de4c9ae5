//! DiffuSpec's diffusion-LM drafter training (DiffuSpec §4.1 eq. 3, docs/diffuspec.md): the
//! target's first layers adapted into a masked-diffusion denoiser the way Dream and DiffuLLaMA
//! adapt AR models — a mask token, Dream's shifted logits (the output at position p − 1
//! predicts slot p), attention bidirectional inside the denoised block — trained with eq. 3:
//! η ~ U[η_min, 1] per block, each block slot replaced by the mask with probability η, and
//! cross-entropy on the corrupted slots only.
//!
//! Layout (anchor form, [`Diffusion::layout`]): the real tokens once, causal (slot i predicts
//! x_{i+1}: the first block slot after anchor i, always corrupted at run time); then, after a
//! sampled fraction of anchors a, a block of k slots at positions a+1..a+k holding the mask or
//! the clean token, each seeing the real tokens 0..=a and the whole block. Block slot j's
//! output predicts x_{a+j+1} when slot j + 1 is corrupted. This is block diffusion: the
//! prefix stays causal, so drafting can keep it in a KV cache (`drafters::diffuspec`'s fast
//! mode) — the drafter's faithful mode, full attention over the prefix as Dream runs, is
//! therefore out of its training distribution for the prefix; `docs/diffuspec.md` measures
//! both. η_min = 0 is the paper's U[0, 1].
//!
//! The network, loss, loop, export and evaluation are PARD's (`train::pard`), which this
//! objective plugs into ([`crate::train::pard::Objective`]).

use crate::drafters::vocab::DraftVocab;
use crate::error::{Error, Result};
use crate::train::pard::{Layout, Objective};
use crate::train::run;
use crate::types::TokenId;
use rand_chacha::ChaCha8Rng;
use rand_core::RngCore;
use serde::{Deserialize, Serialize};

/// The masked-diffusion objective's settings (also `paradraft train dlm`'s flags).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, clap::Args)]
pub struct Diffusion {
    /// Block length k: slots denoised per drafting pass.
    #[arg(long, default_value_t = 8)]
    pub k: usize,
    /// Fraction of anchors that get a block in a sequence (cost ≈ 1 + k · frac slots per
    /// token).
    #[arg(long, default_value_t = 0.3)]
    pub block_frac: f64,
    /// Lowest noise level: η ~ U[eta_min, 1] per block (0: the paper's U[0, 1]).
    #[arg(long, default_value_t = 0.0)]
    pub eta_min: f64,
}

impl Default for Diffusion {
    fn default() -> Self {
        Diffusion {
            k: 8,
            block_frac: 0.3,
            eta_min: 0.0,
        }
    }
}

fn uniform(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

impl Diffusion {
    /// The block after anchor `a` (slots a+1..=a+mask.len(), `mask[j]` whether slot j + 1 is
    /// corrupted): inputs, positions, visibility (real 0..=a and the whole block) and the
    /// labels of corrupted slots 2.. (slot 1's is the real stream's).
    pub fn push_block(
        l: &mut Layout,
        tokens: &[TokenId],
        a: usize,
        corrupt: &[bool],
        mask: TokenId,
        vocab: &DraftVocab,
    ) {
        let b0 = l.tokens.len() as u32;
        let len = corrupt.len() as u32;
        for (j, &c) in corrupt.iter().enumerate() {
            let p = a + 1 + j;
            l.tokens.push(if c { mask } else { tokens[p] });
            l.positions.push(p as u32);
            l.ranges.push([(0, a as u32 + 1), (b0, b0 + len)]);
        }
        for (j, &c) in corrupt.iter().enumerate().skip(1) {
            if c {
                // Dream's shift: the output at slot j (position a + j) predicts slot j + 1.
                l.label(tokens, vocab, b0 as usize + j - 1, a + 1 + j, j as u8 + 1);
            }
        }
    }
}

impl Objective for Diffusion {
    fn check(&self) -> Result<()> {
        let ok = (2..=64).contains(&self.k)
            && self.block_frac > 0.0
            && self.block_frac <= 1.0
            && (0.0..1.0).contains(&self.eta_min);
        if !ok {
            return Err(Error::BadRequest(format!(
                "masked diffusion needs 2 ≤ k ≤ 64, 0 < block fraction ≤ 1 and 0 ≤ η_min < 1 (got k {}, {}, {})",
                self.k, self.block_frac, self.eta_min
            )));
        }
        Ok(())
    }

    fn layout(
        &self,
        tokens: &[TokenId],
        mask: TokenId,
        vocab: &DraftVocab,
        rng: &mut ChaCha8Rng,
    ) -> Layout {
        let mut l = Layout::real(tokens, vocab);
        let s = tokens.len();
        if s < 3 {
            return l;
        }
        // Anchors 0..=s−3 leave at least two block slots.
        let n = ((s - 2) as f64 * self.block_frac).round().max(1.0) as usize;
        for a in run::sample_sorted(0..s - 2, n, rng) {
            let len = self.k.min(s - 1 - a);
            let eta = self.eta_min + (1.0 - self.eta_min) * uniform(rng);
            let mut corrupt: Vec<bool> = (0..len).map(|_| uniform(rng) < eta).collect();
            if !corrupt[1..].iter().any(|&c| c) {
                // A block with nothing to denoise beyond slot 1 teaches nothing: corrupt one.
                corrupt[1 + (rng.next_u64() % (len as u64 - 1)) as usize] = true;
            }
            Self::push_block(&mut l, tokens, a, &corrupt, mask, vocab);
        }
        l
    }

    fn eval_layout(
        &self,
        tokens: &[TokenId],
        anchors: &[usize],
        k: usize,
        mask: TokenId,
        vocab: &DraftVocab,
    ) -> (Layout, Vec<u32>) {
        let mut l = Layout::real(tokens, vocab);
        let mut rows = vec![];
        for &a in anchors {
            let b0 = l.tokens.len() as u32;
            Self::push_block(&mut l, tokens, a, &vec![true; k], mask, vocab);
            rows.push(a as u32);
            rows.extend(b0..b0 + k as u32 - 1);
        }
        (l, rows)
    }

    fn stamp(&self, v: &mut serde_json::Value, mask: TokenId) {
        v["mask_token_id"] = mask.0.into();
        v["spd_type"] = "diffuspec".into();
        v["dlm_attention"] = "block".into();
        v["dlm_block_size"] = self.k.into();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::SeedableRng;

    fn toks(v: &[u32]) -> Vec<TokenId> {
        v.iter().map(|&t| TokenId(t)).collect()
    }

    /// A hand-worked block: 5 tokens, anchor 1, block of 3 with slot 2 clean.
    #[test]
    fn block_of_a_hand_worked_example() {
        let vocab = DraftVocab::full(32);
        let t = toks(&[10, 11, 12, 13, 14]);
        let mut l = Layout::real(&t, &vocab);
        Diffusion::push_block(&mut l, &t, 1, &[true, false, true], TokenId(3), &vocab);
        assert_eq!(l.tokens, toks(&[10, 11, 12, 13, 14, 3, 13, 3]));
        assert_eq!(l.positions, vec![0, 1, 2, 3, 4, 2, 3, 4]);
        // Every block slot sees tokens 0..=1 and the whole block (bidirectional).
        assert_eq!(&l.ranges[5..], &[[(0, 2), (5, 8)]; 3]);
        // Real slots predict the next token; slot 2 (clean) is not a label; slot 3 (corrupted,
        // x_4 = 14) is predicted by the output at slot 2 (slot index 6).
        assert_eq!(
            l.out,
            vec![(0, 11, 1), (1, 12, 1), (2, 13, 1), (3, 14, 1), (6, 14, 3)]
        );
    }

    /// η spreads over U[η_min, 1]: every block has a corrupted slot past the first, blocks
    /// stay inside the sequence, and the corrupted share follows η's mean.
    #[test]
    fn corruption_follows_eta() {
        let vocab = DraftVocab::full(1000);
        let t: Vec<TokenId> = (0..400).map(|i| TokenId(100 + i)).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for (eta_min, want) in [(0.0, 0.5), (0.6, 0.8)] {
            let d = Diffusion {
                eta_min,
                ..Diffusion::default()
            };
            let (mut masked, mut slots) = (0, 0);
            for _ in 0..20 {
                let l = d.layout(&t, TokenId(3), &vocab, &mut rng);
                let extra = &l.tokens[t.len()..];
                // Each block: its slots' second range; k long but near the sequence's end.
                let mut slot = t.len();
                while slot < l.tokens.len() {
                    let (b0, b1) = l.ranges[slot][1];
                    assert_eq!(b0 as usize, slot);
                    let blk = &l.tokens[slot..b1 as usize];
                    assert!(blk.len() >= 2 && blk.len() <= 8);
                    assert!(blk[1..].contains(&TokenId(3)), "block at {slot}");
                    slot = b1 as usize;
                }
                masked += extra.iter().filter(|&&x| x == TokenId(3)).count();
                slots += extra.len();
                assert!(l.positions.iter().all(|&p| (p as usize) < t.len()));
            }
            let share = masked as f64 / slots as f64;
            assert!((share - want).abs() < 0.05, "η_min {eta_min}: {share}");
            // ≈ block_frac of the anchors.
            assert!((slots / 20) as f64 > 0.25 * 8.0 * 400.0);
        }
    }

    /// The evaluation pass is one all-corrupted block per anchor, scored at the anchor and
    /// slots 1..k−1.
    #[test]
    fn eval_layout_scores_the_drafting_rows() {
        let vocab = DraftVocab::full(64);
        let t: Vec<TokenId> = (0..12).map(|i| TokenId(20 + i)).collect();
        let (l, rows) = Diffusion::default().eval_layout(&t, &[2, 5], 4, TokenId(3), &vocab);
        assert_eq!(rows, vec![2, 12, 13, 14, 5, 16, 17, 18]);
        assert!(l.tokens[12..].iter().all(|&x| x == TokenId(3)));
        assert_eq!(l.positions[16..20], [6, 7, 8, 9]);
    }
}
