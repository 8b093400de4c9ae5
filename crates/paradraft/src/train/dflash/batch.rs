//! Training batches (docs/dflash.md): random anchors per sequence, their blocks
//! [x_a, MASK × (B − 1)] at positions a..a+B−1, labels slot k → x_{a+k} on response tokens, and
//! the context mask (a block sees its own sequence's features strictly before its anchor).
//!
//! Teacher-forced text (sampled answers: samples from `teacher_from` on) is labelled by the
//! target instead: slot k's label is the target's argmax after x_{a+k−1}, and the slot is trained
//! only while x_{a+1}..x_{a+k−1} are each the target's argmax too — where the text left the
//! target's greedy path, a greedy draft from the anchor could not be there (`Labeled::relabel`).

use super::net::{Batch, CResult};
use crate::drafters::vocab::DraftVocab;
use crate::model::Model;
use crate::train::data::Sample;
use crate::train::features::TapSource;
use crate::types::TokenId;
use candle_core::{Device, Tensor};
use rand_chacha::ChaCha8Rng;

/// Anchor positions `a` with both `a` and `a + 1` inside the response (loss mask 1).
pub fn valid_anchors(s: &Sample) -> std::ops::Range<usize> {
    let start = s.prompt_len as usize;
    start..s.tokens.len().saturating_sub(1).max(start)
}

/// Up to `n` distinct valid anchors, uniformly without replacement, sorted.
pub fn sample_anchors(s: &Sample, n: usize, rng: &mut ChaCha8Rng) -> Vec<usize> {
    crate::train::run::sample_sorted(valid_anchors(s), n.max(1), rng)
}

/// A batch plus its labels: `label[j·(B−1) + k−1]` is the draft id slot k of block j must
/// predict, with weight `weight[..]` (0 = no loss: outside the response, past the end, or not
/// in the draft vocabulary).
pub struct Labeled {
    /// One batch per sequence (attention never crosses sequences, so none is packed).
    pub batches: Vec<Batch>,
    pub labels: Vec<u32>,
    pub weights: Vec<f32>,
    /// `[labels, hidden]`: the target's last-layer output at the position before each label
    /// (whose next-token distribution the label was drawn from), when the feature cache keeps
    /// it; the distillation loss scores it with the target's head.
    pub target_hidden: Option<Tensor>,
    /// Per label: whether it is teacher-forced text's (its label a placeholder until
    /// [`Labeled::relabel`]), and the draft id of the text's token there (`u32::MAX`: outside
    /// the draft vocabulary, or not teacher-forced).
    pub teacher: Vec<bool>,
    pub text_tok: Vec<u32>,
}

impl Labeled {
    /// Whether any label is teacher-forced text's.
    pub fn has_teacher(&self) -> bool {
        self.teacher.iter().any(|&t| t)
    }

    /// Labels and weights with the teacher-forced rows relabelled: `argmax(i)` is the target's
    /// argmax (a draft id) for label `i` (`None`: not computed, for rows of weight 0). A teacher
    /// row keeps its weight only while every earlier slot of its block is both scored and the
    /// text's own token; `block` is the block size.
    pub fn relabel(
        &self,
        block: usize,
        argmax: impl Fn(usize) -> Option<u32>,
    ) -> (Vec<u32>, Vec<f32>) {
        let (mut labels, mut weights) = (self.labels.clone(), self.weights.clone());
        let per = block - 1;
        let mut on_path = false;
        for i in 0..labels.len() {
            if i % per == 0 {
                on_path = true;
            }
            if !self.teacher[i] {
                continue;
            }
            let am = argmax(i).filter(|_| self.weights[i] > 0.0);
            match am {
                Some(a) if on_path => labels[i] = a,
                _ => weights[i] = 0.0,
            }
            // The next slot follows the text's token here: on the greedy path only if it is
            // the target's argmax.
            on_path &= am.is_some() && am == Some(self.text_tok[i]);
        }
        (labels, weights)
    }
}

/// Builds the batches of `items` = (sample index, its anchors); samples from `teacher_from` on
/// are teacher-forced text (`usize::MAX`: none).
#[allow(clippy::too_many_arguments)]
pub fn build(
    target: &Model,
    samples: &[Sample],
    feats: &TapSource,
    items: &[(usize, Vec<usize>)],
    block: usize,
    mask_id: TokenId,
    vocab: &DraftVocab,
    gamma: f32,
    teacher_from: usize,
) -> CResult<Labeled> {
    let h = target.config.hidden_size;
    let mut mask_row = vec![0f32; h];
    target.embed_row(mask_id.idx(), &mut mask_row);
    let mut row = vec![0f32; h];
    let (mut batches, mut labels, mut weights) = (vec![], vec![], vec![]);
    let (ctx, tail) = (feats.ctx(), feats.width() - feats.ctx());
    let with_target = tail == h;
    let mut target_hidden = vec![];
    let mut rows = vec![];
    let (mut teacher, mut text_tok) = (vec![], vec![]);
    let dev = &Device::Cpu;
    for (si, anchors) in items {
        let s = &samples[*si];
        let Some(&last) = anchors.last() else {
            continue;
        };
        let forced = *si >= teacher_from;
        if forced && !with_target {
            candle_core::bail!("teacher-forced text needs the target's last layer in the taps");
        }
        // Context: positions 0..last (the latest anchor sees those before it).
        let taps = feats
            .sample(target, *si, s)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let mut features = Vec::with_capacity(last * ctx);
        taps.rows_into(last, &mut features);
        let resp = s.prompt_len as usize;
        let mut block_x = Vec::with_capacity(anchors.len() * block * h);
        let mut block_pos = Vec::with_capacity(anchors.len() * block);
        for &a in anchors {
            target.embed_row(s.tokens[a].idx(), &mut row);
            block_x.extend_from_slice(&row);
            for k in 0..block {
                block_pos.push((a + k) as u32);
                if k == 0 {
                    continue;
                }
                block_x.extend_from_slice(&mask_row);
                let p = a + k;
                let inside = p < s.tokens.len() && p >= resp;
                let tok = inside.then(|| vocab.draft_id(s.tokens[p])).flatten();
                // Teacher-forced text: every slot inside the response is scored (its label,
                // the target's argmax, is in the draft vocabulary by construction).
                let d = if forced { inside.then_some(0) } else { tok };
                teacher.push(forced);
                text_tok.push(if forced {
                    tok.unwrap_or(u32::MAX)
                } else {
                    u32::MAX
                });
                labels.push(d.unwrap_or(0));
                if with_target {
                    // Row p − 1 predicts token p; rows past the end carry no loss.
                    rows.push(if d.is_some() { p - 1 } else { 0 });
                }
                weights.push(if d.is_some() {
                    (-((k - 1) as f32) / gamma).exp()
                } else {
                    0.0
                });
            }
        }
        if with_target {
            taps.tail_rows_into(&rows, &mut target_hidden);
            rows.clear();
        }
        let n = anchors.len() * block;
        batches.push(Batch {
            features: Tensor::from_vec(features, (last, ctx), dev)?,
            ctx_pos: (0..last as u32).collect(),
            block_x: Tensor::from_vec(block_x, (n, h), dev)?,
            block_pos,
            n_blocks: anchors.len(),
            block,
        });
    }
    let target_hidden = if with_target {
        Some(Tensor::from_vec(target_hidden, (labels.len(), h), dev)?)
    } else {
        None
    };
    Ok(Labeled {
        batches,
        labels,
        weights,
        target_hidden,
        teacher,
        text_tok,
    })
}
