//! PARD in a training campaign (#57): COD's layout of each sequence ([`super::layout`]) with
//! the target as teacher, on the campaign's online taps of its last layer.
//!
//! A greedy self-distilled answer keeps its own tokens as labels (on the response they are the
//! target's argmax). Teacher-forced text (sampled answers and corpus: samples from
//! `teacher_from` on) is labelled by the target: the real slot at i by its argmax after
//! x_0..=i; mask j of the chain anchored at a by its argmax after x_0..=a+j, kept only while
//! x_{a+1}..=x_{a+j} are each the target's argmax too (off the greedy path a greedy draft could
//! not be there: DFlash's rule, `train::dflash::batch`). Chains anchored before the first token
//! (a = −1) are left out of teacher-forced text: no target row labels their drafts' prefix.
//! Every scored slot also learns the target's distribution there (KL with weight `kl`).

use super::net::{CResult, Net};
use super::{chains_of, embed};
use crate::error::{Error, Result};
use crate::train::data::Sample;
use crate::train::dflash::net::FrozenHead;
use crate::train::run::{self, cerr};
use crate::types::TokenId;
use candle_core::{Device, Tensor, D};

/// One campaign step's loss over `items` (sample index, its COD chain lengths by anchor + 1 as
/// [`super::cod_lengths`] drew them for the sample cut to `max_seq` tokens): one mean over every
/// scored slot, the subtask-1 accuracy and the slots scored; `None` when nothing is scored.
pub fn campaign_loss(
    net: &Net,
    head: &FrozenHead,
    data: &run::Data,
    items: &[(usize, Vec<usize>)],
    mask: TokenId,
    max_seq: usize,
    kl: f64,
) -> Result<Option<(Tensor, f64, usize)>> {
    let (mut total, mut count, mut hit, mut n1) = (None::<Tensor>, 0usize, 0usize, 0usize);
    for (si, lengths) in items {
        let Some((l, c, h, c1)) = sequence(net, head, data, *si, lengths, mask, max_seq, kl)?
        else {
            continue;
        };
        total = Some(match total {
            None => l,
            Some(t) => (t + l).map_err(cerr)?,
        });
        (count, hit, n1) = (count + c, hit + h, n1 + c1);
    }
    Ok(match total {
        Some(t) if count > 0 => Some((
            (t / count as f64).map_err(cerr)?,
            hit as f64 / n1.max(1) as f64,
            count,
        )),
        _ => None,
    })
}

/// Slots a sequence scores: (slot, draft-vocabulary label, subtask) and, for each, the target
/// row r whose distribution is its teacher's (r predicts token r + 1).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scored {
    pub out: Vec<(u32, u32, u8)>,
    pub rows: Vec<u32>,
}

/// The scored slots of an `n`-token sequence laid out by [`super::layout`] with `chains`:
/// `text[t]` is token t's draft id, `argmax[r]` the target's after x_0..=r (r < n − 1), and
/// `forced` says the text is teacher-forced (see the module's rules).
pub fn scored(
    text: &[Option<u32>],
    argmax: &[u32],
    chains: &[(i64, usize)],
    forced: bool,
) -> Scored {
    let n = text.len();
    let label = |r: usize| if forced { Some(argmax[r]) } else { text[r + 1] };
    let mut s = Scored::default();
    let mut push = |slot: usize, r: usize, depth: usize| {
        if let Some(y) = label(r) {
            s.out.push((slot as u32, y, depth as u8));
            s.rows.push(r as u32);
        }
    };
    for i in 0..n.saturating_sub(1) {
        push(i, i, 1);
    }
    let mut b0 = n;
    for &(a, len) in chains {
        let mut path = !forced || a >= 0;
        for j in 1..=len {
            let r = a + j as i64; // mask j sits at position a + j and predicts x_{a+j+1}
            if forced && path {
                // x_{a+j} (drafted before this mask) must be the target's argmax after a+j−1.
                let p = (r - 1) as usize;
                path = text[p + 1] == Some(argmax[p]);
            }
            if path && r >= 0 && (r as usize) + 1 < n {
                push(b0 + j - 1, r as usize, j + 1);
            }
        }
        b0 += len;
    }
    s
}

/// One sequence: Σ loss over its scored slots, their count, subtask-1 hits and count.
#[allow(clippy::too_many_arguments)]
fn sequence(
    net: &Net,
    head: &FrozenHead,
    data: &run::Data,
    si: usize,
    lengths: &[usize],
    mask: TokenId,
    max_seq: usize,
    kl: f64,
) -> Result<Option<(Tensor, usize, usize, usize)>> {
    let s = &data.samples[si];
    let n = s.tokens.len().min(max_seq);
    if n < 2 {
        return Ok(None);
    }
    if lengths.len() != n + 1 {
        return Err(Error::BadRequest(format!(
            "PARD campaign: {} chain lengths for a {n}-token sequence",
            lengths.len()
        )));
    }
    let tokens = &s.tokens[..n];
    let cut = Sample {
        prompt_index: s.prompt_index,
        prompt_len: s.prompt_len.min(n as u32),
        tokens: tokens.to_vec(),
    };
    let taps = data.features.sample(data.target, si, &cut)?;
    let h = data.target.config.hidden_size;
    let mut last = Vec::with_capacity((n - 1) * h);
    taps.tail_rows_into(&(0..n - 1).collect::<Vec<_>>(), &mut last);
    if last.len() != (n - 1) * h {
        return Err(Error::BadRequest(
            "PARD campaign: the taps must end with the target's last layer".into(),
        ));
    }
    let chains = chains_of(lengths);
    let teach = || -> CResult<_> {
        let t = head.target_logits(&Tensor::from_vec(last, (n - 1, h), &Device::Cpu)?)?;
        let am: Vec<u32> = t.argmax(D::Minus1)?.to_vec1()?;
        Ok((t, am))
    };
    let (target, am) = teach().map_err(cerr)?;
    let text: Vec<Option<u32>> = tokens.iter().map(|&t| data.vocab.draft_id(t)).collect();
    let sc = scored(&text, &am, &chains, si >= data.teacher_from);
    let mut l = super::layout(tokens, &chains, mask, data.vocab);
    l.out = sc.out;
    let Some(lb) = embed(data.target, l).map_err(cerr)? else {
        return Ok(None);
    };
    let forward = || -> CResult<_> {
        let logits = head.forward(&net.forward(&lb.batch)?)?;
        let idx = Tensor::from_vec(sc.rows.clone(), sc.rows.len(), &Device::Cpu)?;
        let p = target.index_select(&idx, 0)?;
        let loss = crate::train::fused::cross_entropy_kl(&logits, &lb.labels, Some(&p), kl)?;
        let am: Vec<u32> = logits.argmax(D::Minus1)?.to_vec1()?;
        Ok((loss.sum_all()?, am))
    };
    let (loss, got) = forward().map_err(cerr)?;
    let (mut hit, mut n1) = (0, 0);
    for (r, &d) in lb.depth.iter().enumerate() {
        if d == 1 {
            n1 += 1;
            hit += (got[r] == lb.labels[r]) as usize;
        }
    }
    Ok(Some((loss, lb.labels.len(), hit, n1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Greedy text keeps its tokens as labels (out-of-vocabulary ones unscored); teacher-forced
    /// text takes the target's argmax, and a chain's masks stop at the first drafted token off
    /// the target's greedy path; a = −1 chains only in greedy text.
    #[test]
    fn slots_are_labelled_by_the_text_or_along_the_targets_greedy_path() {
        // 5 tokens; token 2 is outside the draft vocabulary.
        let text = [Some(10), Some(11), None, Some(13), Some(14)];
        // The target's argmax after x_0..=r: agrees with the text at r = 0 (x_1) and r = 2 (x_3).
        let am = [11, 99, 13, 77];
        let chains = [(-1, 2), (0, 3), (1, 1)];
        let g = scored(&text, &am, &chains, false);
        // Real slots 0..4 predict x_1..x_4 (x_2 unscored); chain (-1, 2) at slots 5, 6 predicts
        // x_1, x_2; chain (0, 3) at 7, 8, 9 predicts x_2, x_3, x_4; chain (1, 1) at 10 x_3.
        assert_eq!(
            g.out,
            vec![
                (0, 11, 1),
                (2, 13, 1),
                (3, 14, 1),
                (5, 11, 2),
                (8, 13, 3),
                (9, 14, 4),
                (10, 13, 2)
            ]
        );
        assert_eq!(g.rows, vec![0, 2, 3, 0, 2, 3, 2]);
        let t = scored(&text, &am, &chains, true);
        // Chain (0, 3): mask 1 follows x_0 → x_1 drafted; x_1 = argmax(0) so mask 1 (row 1) is
        // scored; mask 2 needs x_2 = argmax(1): 99 ≠ None, so it and mask 3 are not.
        // Chain (1, 1): needs x_2 = argmax(1): no.
        assert_eq!(
            t.out,
            vec![(0, 11, 1), (1, 99, 1), (2, 13, 1), (3, 77, 1), (7, 99, 2)]
        );
        assert_eq!(t.rows, vec![0, 1, 2, 3, 1]);
    }

    /// On greedy text the slots are exactly COD's training layout's ([`super::super::layout`]).
    #[test]
    fn greedy_slots_are_the_layouts() {
        use crate::drafters::vocab::DraftVocab;
        use rand_core::SeedableRng;
        let vocab = DraftVocab::full(50);
        let tokens: Vec<TokenId> = (0..40u32).map(|i| TokenId(i * 7 % 50)).collect();
        let text: Vec<Option<u32>> = tokens.iter().map(|&t| vocab.draft_id(t)).collect();
        let am = vec![0u32; tokens.len() - 1];
        for seed in 0..5 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let chains =
                super::super::cod_chains(tokens.len(), &super::super::Cod::default(), &mut rng);
            let l = super::super::layout(&tokens, &chains, TokenId(3), &vocab);
            assert_eq!(scored(&text, &am, &chains, false).out, l.out, "seed {seed}");
        }
    }
}
