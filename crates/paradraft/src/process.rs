//! What happens to the target's logits between the forward and the sampler — `logit_bias` and
//! the repetition penalties — and the log-probabilities a request asks for.
//!
//! Penalties depend on the context, so a verify forward's rows are processed each over its
//! *own* context: the committed tokens, then the draft path from the root to the row's node.
//! Every rule then sees, at every node, exactly the distribution AR decoding would see with
//! that node's prefix committed, and speculation stays lossless (token-identical at T = 0,
//! the coupled rule's seeded identity and the rejection rules' distribution at T > 0).
//!
//! Order, as vLLM's: bias, then the repetition penalty (CTRL's: positive logits divided,
//! negative multiplied, for every token of the prompt or the output), then the presence and
//! frequency penalties (OpenAI's: subtracted for tokens of the output, once and per
//! occurrence). Log-probabilities are the log-softmax of the processed logits, before
//! temperature and truncation (vLLM's `processed_logprobs`; without bias or penalties, the
//! model's own log-probabilities).

use crate::draft::{DraftTree, NodeId};
use crate::error::{Error, Result};
use crate::grammar::{Constraint, Grammar};
use crate::model::Tokenizer;
use crate::runtime::ops;
use crate::types::TokenId;
use serde::Serialize;
use std::collections::{HashMap, HashSet};

/// A request's logit processing.
#[derive(Clone, Debug, PartialEq)]
pub struct Processing {
    /// Added to a token's logit (OpenAI `logit_bias`, in −100..=100).
    pub logit_bias: Vec<(TokenId, f32)>,
    /// Subtracted once from the logit of each token the output holds (−2..=2).
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the output (−2..=2).
    pub frequency_penalty: f32,
    /// > 1 discourages tokens of the prompt and the output, < 1 favours them; 1 is off.
    pub repetition_penalty: f32,
    /// Log-probabilities of each output token and of this many alternatives (`None`: none).
    pub logprobs: Option<usize>,
    /// What the output must match ([`crate::grammar`]).
    pub grammar: Option<Grammar>,
}

impl Default for Processing {
    fn default() -> Self {
        Processing {
            logit_bias: Vec::new(),
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logprobs: None,
            grammar: None,
        }
    }
}

/// A greedy row's grammar checks its best this many ids before it masks the row.
const BEST_OF: usize = 16;

/// Most ids of a row re-scored exactly for a greedy choice (the best-scored first).
const RESCORE_CAP: usize = 256;

/// Exact logits for a round's rows (row, token) and the margin below a row's best value
/// within which its exact argmax may lie ([`crate::speculative::RoundOutput`]).
pub type Exact<'a> = (&'a dyn Fn(usize, TokenId) -> f32, f32);

/// The most alternatives a token's log-probabilities may list.
pub const MAX_TOP_LOGPROBS: usize = 20;

impl Processing {
    /// Whether the logits reach the sampler as the model gave them.
    pub fn is_identity(&self) -> bool {
        self.logit_bias.is_empty()
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
            && self.repetition_penalty == 1.0
            && self.grammar.is_none()
    }

    /// Whether anything is done at all (processing or log-probabilities).
    pub fn is_off(&self) -> bool {
        self.is_identity() && self.logprobs.is_none()
    }

    /// Checks the values against a vocabulary of `vocab` tokens.
    pub fn validate(&self, vocab: usize) -> Result<()> {
        let bad = |m: String| Err(Error::BadSampling(m));
        for &(t, b) in &self.logit_bias {
            if t.idx() >= vocab {
                return bad(format!(
                    "logit_bias names token {} outside the vocabulary (0..{vocab})",
                    t.0
                ));
            }
            if !(-100.0..=100.0).contains(&b) {
                return bad(format!(
                    "logit_bias for token {} must be in -100..=100, got {b}",
                    t.0
                ));
            }
        }
        for (v, name) in [
            (self.presence_penalty, "presence penalty"),
            (self.frequency_penalty, "frequency penalty"),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(format!("{name} must be in -2..=2, got {v}"));
            }
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0 && r <= 100.0) {
            return bad(format!("repetition penalty must be in (0, 100], got {r}"));
        }
        if self.logprobs.is_some_and(|k| k > MAX_TOP_LOGPROBS) {
            return bad(format!(
                "at most {MAX_TOP_LOGPROBS} top log-probabilities per token"
            ));
        }
        Ok(())
    }
}

/// One output token's log-probability and, when asked for, its best alternatives (best
/// first, ties to the lower id).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenLogprob {
    pub token: TokenId,
    pub logprob: f32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<(TokenId, f32)>,
}

/// A session's processing: the context's token counts, and the current round's processed rows.
pub struct Processor {
    p: Processing,
    /// Occurrences of each token in the output so far.
    output: HashMap<TokenId, u32>,
    /// The prompt's distinct tokens (read by the repetition penalty only).
    prompt: HashSet<TokenId>,
    /// Processed rows (`rows × vocab`), when processing changes them.
    buf: Vec<f32>,
    /// Per row of the round: processed yet.
    done: Vec<bool>,
    argmax: Vec<TokenId>,
    grammar: Option<Constraint>,
    /// Rows are read for their argmax only (greedy, no log-probabilities): a grammar then
    /// checks the best few tokens instead of masking the row.
    only_argmax: bool,
    /// Greedy: each row's token is chosen on exact values (with or without log-probabilities).
    greedy: bool,
}

impl Processor {
    /// The processing of a request whose prompt is `prompt`, for a model of `vocab` logits
    /// and its tokenizer `tok`; `None` when it does nothing.
    pub fn new(
        p: &Processing,
        prompt: &[TokenId],
        vocab: usize,
        tok: &Tokenizer,
        greedy: bool,
    ) -> Result<Option<Processor>> {
        p.validate(vocab)?;
        if p.is_off() {
            return Ok(None);
        }
        let grammar = match &p.grammar {
            Some(g) => Some(crate::grammar::GrammarEnv::of(tok, vocab)?.constraint(g)?),
            None => None,
        };
        Ok(Some(Processor {
            p: p.clone(),
            output: HashMap::new(),
            prompt: if p.repetition_penalty != 1.0 {
                prompt.iter().copied().collect()
            } else {
                HashSet::new()
            },
            buf: Vec::new(),
            done: Vec::new(),
            argmax: Vec::new(),
            grammar,
            only_argmax: greedy && p.logprobs.is_none(),
            greedy,
        }))
    }

    /// Another output token in the context.
    pub fn push(&mut self, t: TokenId) {
        *self.output.entry(t).or_default() += 1;
        if let Some(g) = &mut self.grammar {
            g.push(t);
        }
    }

    /// The tokens the grammar forces after the committed ones (none without a grammar).
    pub fn forced(&mut self) -> Vec<TokenId> {
        self.grammar
            .as_mut()
            .map_or_else(Vec::new, Constraint::forced)
    }

    /// Whether the grammar (if any) allows `path` after the committed tokens: a drafted node
    /// it does not allow has probability 0 and is cut before it costs a verify row.
    pub fn allows(&mut self, path: &[TokenId]) -> bool {
        self.grammar.as_mut().is_none_or(|g| g.allows(path))
    }

    /// Whether a grammar constrains the output.
    pub fn constrained(&self) -> bool {
        self.grammar.is_some()
    }

    /// Processes one row of logits over the context plus `path` (tokens after the context):
    /// bias, penalties, then the grammar's mask.
    pub fn apply(&mut self, row: &mut [f32], path: &[TokenId]) {
        self.penalise(row, path);
        if let Some(g) = &mut self.grammar {
            g.mask(row, path);
        }
    }

    fn penalise(&self, row: &mut [f32], path: &[TokenId]) {
        let p = &self.p;
        for &(t, b) in &p.logit_bias {
            row[t.idx()] += b;
        }
        let in_path = |t: TokenId| path.iter().filter(|&&x| x == t).count() as u32;
        let rep = p.repetition_penalty;
        let pen = |row: &mut [f32], t: TokenId, count: u32, in_prompt: bool| {
            let l = &mut row[t.idx()];
            if rep != 1.0 && (count > 0 || in_prompt) {
                *l = if *l > 0.0 { *l / rep } else { *l * rep };
            }
            if count > 0 {
                *l -= p.frequency_penalty * count as f32 + p.presence_penalty;
            }
        };
        if p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 && rep == 1.0 {
            return;
        }
        for (&t, &c) in &self.output {
            pen(row, t, c + in_path(t), self.prompt.contains(&t));
        }
        for &t in &self.prompt {
            if !self.output.contains_key(&t) {
                pen(row, t, in_path(t), true);
            }
        }
        for (i, &t) in path.iter().enumerate() {
            let first = !path[..i].contains(&t);
            if first && !self.output.contains_key(&t) && !self.prompt.contains(&t) {
                pen(row, t, in_path(t), false);
            }
        }
    }

    /// Starts a round whose rows — row 0 the root, row i + 1 node i of `tree` — are `raw`
    /// (`rows × v`), and processes row 0. Rows are processed on demand
    /// ([`Processor::process_row`]): verification reads only the rows of the root and the
    /// accepted path, and a grammar's mask is the dear part.
    pub fn begin_round(&mut self, tree: &DraftTree, raw: &[f32], v: usize, exact: Exact) {
        let rows = tree.len() + 1;
        self.done.clear();
        self.done.resize(rows, false);
        self.argmax.clear();
        // A token no node holds: a walk reaching a row not processed yet stops there.
        self.argmax.resize(rows, TokenId(u32::MAX));
        if !self.p.is_identity() && self.buf.len() < rows * v {
            self.buf.resize(rows * v, 0.0);
        }
        self.process_row(tree, 0, raw, v, exact);
    }

    /// Processes row `r` of the round over its own path. A greedy row's token is chosen on
    /// exact values: the ids its values could rank wrongly (within `exact.1` of the best the
    /// processing allows) are re-scored with `exact.0`, so the choice is the same whether
    /// the row came back exact, from int8 activations or from the 4-bit screen.
    pub fn process_row(&mut self, tree: &DraftTree, r: usize, raw: &[f32], v: usize, exact: Exact) {
        if self.done[r] {
            return;
        }
        self.done[r] = true;
        let src = &raw[r * v..(r + 1) * v];
        if self.p.is_identity() {
            self.argmax[r] = ops::argmax(src);
            return;
        }
        let path = tree.path((r > 0).then(|| NodeId(r as u32 - 1)));
        let mut buf = std::mem::take(&mut self.buf);
        let row = &mut buf[r * v..(r + 1) * v];
        row.copy_from_slice(src);
        self.penalise(row, &path);
        // A greedy row read for log-probabilities too is masked whole (they are normalised
        // over what the grammar allows), then chosen as one read for its argmax only.
        if !self.only_argmax {
            if let Some(g) = &mut self.grammar {
                g.mask(row, &path);
            }
        }
        self.argmax[r] = if self.greedy {
            self.exact_best(row, &path, |t| exact.0(r, t), exact.1)
        } else {
            ops::argmax(row)
        };
        self.buf = buf;
    }

    /// The best token of a processed greedy `row` on exact values (`raw(t)`: `t`'s exact
    /// logit before processing): the grammar's candidates among the row's best few when they
    /// hold every id within `margin` of the best allowed, else those of the masked row (a row
    /// read for log-probabilities comes masked; at most [`RESCORE_CAP`] of them); each
    /// re-scored and processed (its exact value written back), the best kept (ties to the
    /// lowest id).
    fn exact_best(
        &mut self,
        row: &mut [f32],
        path: &[TokenId],
        raw: impl Fn(TokenId) -> f32,
        margin: f32,
    ) -> TokenId {
        let within = |row: &[f32]| {
            let mut ids = Vec::new();
            let top = ops::max_value(row);
            if top > f32::NEG_INFINITY {
                ops::indices_at_least(row, top - margin, &mut ids);
            }
            // A flat row can put thousands within the margin: the best-scored few are enough.
            if ids.len() > RESCORE_CAP {
                ids.select_nth_unstable_by(RESCORE_CAP - 1, |&a, &b| {
                    row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b))
                });
                ids.truncate(RESCORE_CAP);
            }
            ids.into_iter().map(TokenId).collect::<Vec<_>>()
        };
        let cands = match &mut self.grammar {
            Some(_) if !self.only_argmax => within(row), // masked already
            Some(g) => match g.best(row, path, BEST_OF, margin) {
                Some(c) => c,
                None => {
                    g.mask(row, path);
                    within(row)
                }
            },
            None => within(row),
        };
        let mut best: Option<(TokenId, f32)> = None;
        for t in cands {
            let e = self.adjust(t, raw(t), path);
            row[t.idx()] = e;
            if best.is_none_or(|(b, be)| e > be || (e == be && t < b)) {
                best = Some((t, e));
            }
        }
        best.map_or_else(|| ops::argmax(row), |b| b.0)
    }

    /// Whether the round's rows are read for their argmax only (greedy, no log-probabilities):
    /// they may then come from the 4-bit screen (`Logits::Screened`).
    pub fn greedy_rows(&self) -> bool {
        self.only_argmax
    }

    /// `l`, token `t`'s logit, as [`Processor::penalise`] leaves it over `path`.
    fn adjust(&self, t: TokenId, mut l: f32, path: &[TokenId]) -> f32 {
        let p = &self.p;
        for &(b, v) in &p.logit_bias {
            if b == t {
                l += v;
            }
        }
        if p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 && p.repetition_penalty == 1.0 {
            return l;
        }
        let count = self.output.get(&t).copied().unwrap_or(0)
            + path.iter().filter(|&&x| x == t).count() as u32;
        let rep = p.repetition_penalty;
        if rep != 1.0 && (count > 0 || self.prompt.contains(&t)) {
            l = if l > 0.0 { l / rep } else { l * rep };
        }
        if count > 0 {
            l -= p.frequency_penalty * count as f32 + p.presence_penalty;
        }
        l
    }

    /// The rows a verification outcome was decided on (the root's and those of its `accepted`
    /// nodes) that were not processed: empty when the outcome stands.
    pub fn missing(&self, accepted: &[NodeId]) -> Vec<usize> {
        std::iter::once(0)
            .chain(accepted.iter().map(|&n| n.idx() + 1))
            .filter(|&r| !self.done[r])
            .collect()
    }

    /// Row `r` of the round (`raw`: its unprocessed logits); processed once
    /// [`Processor::process_row`] has run on it.
    pub fn row<'a>(&'a self, raw: &'a [f32], r: usize, v: usize) -> &'a [f32] {
        let src = if self.p.is_identity() || !self.done[r] {
            raw
        } else {
            &self.buf
        };
        &src[r * v..(r + 1) * v]
    }

    /// The argmaxes of the last round's processed rows.
    pub fn argmax(&self) -> &[TokenId] {
        &self.argmax
    }

    /// Processes the first token's row (the prompt's last) in place.
    pub fn first(&mut self, row: &mut [f32]) {
        self.apply(row, &[]);
    }

    /// `t`'s log-probability in a processed row, with the alternatives asked for; `None`
    /// when the request asked for none.
    pub fn logprob(&self, row: &[f32], t: TokenId) -> Option<TokenLogprob> {
        let k = self.p.logprobs?;
        let z = ops::log_sum_exp(row);
        Some(TokenLogprob {
            token: t,
            logprob: row[t.idx()] - z,
            top: if k > 0 {
                ops::top_k(row, k)
                    .into_iter()
                    .filter(|e| e.1.is_finite())
                    .map(|(id, l)| (id, l - z))
                    .collect()
            } else {
                Vec::new()
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::model::tokenizer::tiny_fixture as tok;

    fn proc(p: Processing, prompt: &[u32]) -> Processor {
        let prompt: Vec<TokenId> = prompt.iter().map(|&t| TokenId(t)).collect();
        Processor::new(&p, &prompt, 6, &tok(), false)
            .unwrap()
            .unwrap()
    }

    /// Each penalty by hand on a 6-token vocabulary.
    #[test]
    fn penalties_and_bias_by_hand() {
        let logits = [1.0f32, -1.0, 2.0, 0.5, -0.5, 3.0];
        let mut p = proc(
            Processing {
                logit_bias: vec![(TokenId(4), 10.0)],
                presence_penalty: 0.5,
                frequency_penalty: 0.25,
                repetition_penalty: 2.0,
                ..Default::default()
            },
            &[0, 1],
        );
        p.push(TokenId(2));
        p.push(TokenId(2));
        p.push(TokenId(1));
        let mut row = logits;
        p.apply(&mut row, &[TokenId(3)]);
        let want = [
            0.5,               // prompt only: 1 / 2
            -2.0 - 0.25 - 0.5, // prompt and output once: −1 × 2, then −0.25 − 0.5
            1.0 - 0.5 - 0.5,   // output twice: 2 / 2 − 0.25·2 − 0.5
            0.25 - 0.25 - 0.5, // on the path only: 0.5 / 2 − 0.25 − 0.5
            9.5,               // bias only
            3.0,               // untouched
        ];
        for (a, b) in row.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{row:?} vs {want:?}");
        }
    }

    /// A round's rows each see their own path: the row of a node equals a fresh processor's
    /// row with the path pushed as output.
    /// The one-token form of the penalties (what a re-scored id gets) agrees with the row's.
    #[test]
    fn adjust_is_penalise_for_one_token() {
        let p = Processing {
            logit_bias: vec![(TokenId(3), 2.5), (TokenId(1), -1.0), (TokenId(3), 0.5)],
            presence_penalty: 0.6,
            frequency_penalty: 0.3,
            repetition_penalty: 1.3,
            ..Default::default()
        };
        let mut pr = proc(p, &[1, 2, 5]);
        for t in [2, 4, 4] {
            pr.push(TokenId(t));
        }
        let path = [TokenId(5), TokenId(0), TokenId(0)];
        let raw: Vec<f32> = (0..6).map(|i| (i as f32 - 2.5) * 0.7).collect();
        let mut row = raw.clone();
        pr.penalise(&mut row, &path);
        for (t, (&r, &want)) in raw.iter().zip(&row).enumerate() {
            assert_eq!(pr.adjust(TokenId(t as u32), r, &path), want, "token {t}");
        }
        assert_ne!(row, raw);
    }

    #[test]
    fn each_row_sees_its_own_path() {
        let params = Processing {
            presence_penalty: 0.7,
            frequency_penalty: 0.3,
            repetition_penalty: 1.3,
            ..Default::default()
        };
        let mut tree = DraftTree::new();
        let a = tree.push(None, TokenId(1), None).unwrap();
        let b = tree.push(Some(a), TokenId(1), None).unwrap();
        tree.push(Some(a), TokenId(5), None).unwrap();
        tree.push(Some(b), TokenId(3), None).unwrap();
        let raw: Vec<f32> = (0..5 * 6).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        let mut p = proc(params.clone(), &[3]);
        p.push(TokenId(0));
        let exact = |r: usize, t: TokenId| raw[r * 6 + t.idx()];
        p.begin_round(&tree, &raw, 6, (&exact, 0.0));
        for r in 1..5 {
            p.process_row(&tree, r, &raw, 6, (&exact, 0.0));
        }
        let paths: [&[u32]; 5] = [&[], &[1], &[1, 1], &[1, 5], &[1, 1, 3]];
        for (r, path) in paths.iter().enumerate() {
            let mut fresh = proc(params.clone(), &[3]);
            fresh.push(TokenId(0));
            for &t in *path {
                fresh.push(TokenId(t));
            }
            let mut want = raw[r * 6..(r + 1) * 6].to_vec();
            fresh.apply(&mut want, &[]);
            assert_eq!(p.row(&raw, r, 6), want.as_slice(), "row {r}");
            assert_eq!(p.argmax()[r], ops::argmax(&want));
        }
    }

    #[test]
    fn log_probabilities_normalise() {
        let p = proc(
            Processing {
                logprobs: Some(3),
                ..Default::default()
            },
            &[],
        );
        let row = [1.0f32, 2.0, 3.0, 0.0, -1.0, 0.5];
        let lp = p.logprob(&row, TokenId(1)).unwrap();
        let z: f32 = row.iter().map(|x| x.exp()).sum::<f32>().ln();
        assert!((lp.logprob - (2.0 - z)).abs() < 1e-5);
        let ids: Vec<u32> = lp.top.iter().map(|e| e.0 .0).collect();
        assert_eq!(ids, vec![2, 1, 0]);
        assert!((lp.top[0].1 - (3.0 - z)).abs() < 1e-5);
    }

    #[test]
    fn refuses_bad_values() {
        let tok = tok();
        for p in [
            Processing {
                logit_bias: vec![(TokenId(6), 1.0)],
                ..Default::default()
            },
            Processing {
                logit_bias: vec![(TokenId(1), 101.0)],
                ..Default::default()
            },
            Processing {
                presence_penalty: 2.5,
                ..Default::default()
            },
            Processing {
                frequency_penalty: f32::NAN,
                ..Default::default()
            },
            Processing {
                repetition_penalty: 0.0,
                ..Default::default()
            },
            Processing {
                logprobs: Some(21),
                ..Default::default()
            },
        ] {
            assert!(Processor::new(&p, &[], 6, &tok, false).is_err(), "{p:?}");
        }
        assert!(Processor::new(&Processing::default(), &[], 6, &tok, false)
            .unwrap()
            .is_none());
    }
}
