//! One forward for many sessions (continuous batching): every member plans its part (a chunk
//! of its prompt or a speculative round sized for its share of the batch), one multi-sequence
//! forward runs all their rows (each over its own cache, with its own tree mask), and each
//! member commits its results. A row's results are those it would get alone (the forward is
//! batch-invariant), so a session's tokens do not depend on what it was batched with.

use super::decode::{RoundOutput, Session, SpecGeneration, Speculation, FULL_ROW, NO_ROW};
use super::sizing::BatchShape;
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::{Batch, Logits, Model, Output, OutputSpec, Rows, Scratch, Tokenizer};
use crate::request::GenerateParams;
use crate::types::TokenId;

/// Generates a continuation of `prompt`, drafting with `sp.drafter` and verifying each draft
/// in one target forward: one [`Session`] stepped to its end by the [`Stepper`] the engine
/// batches sessions with, its prompt prefilled in one pass.
pub fn speculative_generate<'a>(
    model: &Model,
    tok: &'a Tokenizer,
    kv: &mut KvCache,
    prompt: &[TokenId],
    params: &GenerateParams,
    sp: Speculation<'a>,
    mut on_text: impl FnMut(&str),
) -> Result<SpecGeneration> {
    let mut session = Session::new(tok, kv, prompt, params, sp, model.config.hidden_size)?;
    let mut stepper = Stepper::default();
    loop {
        let mut alone = [Member {
            kv: &mut *kv,
            session: &mut session,
            on_text: &mut on_text,
        }];
        if stepper.step(model, &mut alone, usize::MAX)?.rows == 0 {
            break;
        }
    }
    Ok(session.finish(&mut on_text))
}

/// A session in a step, with its cache and where its text goes.
pub struct Member<'m, 'a> {
    pub kv: &'m mut KvCache,
    pub session: &'m mut Session<'a>,
    pub on_text: &'m mut dyn FnMut(&str),
}

/// What one step did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Per member: whether it took part (false: finished, or waiting for prefill budget).
    pub planned: Vec<bool>,
    /// Per member: it has ended (stopped or out of cache) and can be retired.
    pub finished: Vec<bool>,
    /// Rows of the forward (0: nothing ran).
    pub rows: usize,
    /// Prompt tokens among them.
    pub prefill_rows: usize,
    /// Rounds of output-layer passes over the forward's final states: 1, or more when a
    /// verification reached rows outside the first ones ([`Session::resolve`]).
    pub output_rounds: usize,
}

/// Scratch kept between steps.
#[derive(Default)]
pub struct Stepper {
    scratch: Scratch,
    results: RowResults,
}

/// What a member's rows take from the output layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    None,
    /// Argmaxes (and top lists when some member asks for them).
    Argmax,
    Full,
}

impl Kind {
    fn of(logits: Logits) -> Kind {
        match logits {
            Logits::None => Kind::None,
            Logits::Full => Kind::Full,
            Logits::Argmax | Logits::ArgmaxTop(_) | Logits::TopK(_) => Kind::Argmax,
        }
    }
}

fn argmax_logits(top_k: usize) -> Logits {
    match top_k {
        0 => Logits::Argmax,
        k => Logits::ArgmaxTop(k),
    }
}

/// A step's output-layer results, gathered over its passes: per batch row the index of its
/// results in `argmax` and `top` (argmax rows) or in `logits` (full rows, flagged [`FULL_ROW`]),
/// [`NO_ROW`] for a row without any.
#[derive(Default)]
struct RowResults {
    index: Vec<u32>,
    argmax: Vec<TokenId>,
    top: Vec<Vec<(TokenId, f32)>>,
    logits: Vec<f32>,
    vocab: usize,
}

impl RowResults {
    fn reset(&mut self, rows: usize) {
        self.index.clear();
        self.index.resize(rows, NO_ROW);
        self.argmax.clear();
        self.top.clear();
        self.logits.clear();
    }

    /// Takes `out`'s results for batch `rows` (in `out`'s row order): full logits or argmaxes.
    fn add(&mut self, rows: &[usize], out: &mut Output, full: bool) {
        self.vocab = out.vocab;
        for (i, &r) in rows.iter().enumerate() {
            if full {
                self.index[r] = FULL_ROW | (self.logits.len() / out.vocab.max(1)) as u32;
                self.logits.extend_from_slice(out.logits_row(i));
            } else {
                self.index[r] = self.argmax.len() as u32;
                self.argmax.push(out.argmax[i]);
                self.top
                    .push(out.top.get_mut(i).map(std::mem::take).unwrap_or_default());
            }
        }
    }
}

impl Stepper {
    /// One more output pass over the last forward's final states: argmaxes for `arg` rows,
    /// full logits for `full` rows.
    fn output(&mut self, model: &Model, arg: &[usize], full: &[usize], top_k: usize) -> Result<()> {
        for (rows, logits, is_full) in [
            (arg, argmax_logits(top_k), false),
            (full, Logits::Full, true),
        ] {
            if rows.is_empty() {
                continue;
            }
            let spec = OutputSpec {
                rows: Rows::Some(rows.to_vec()),
                logits,
                taps: vec![],
            };
            model.output_again(&spec, &mut self.scratch)?;
            self.results.add(rows, &mut self.scratch.out, is_full);
        }
        Ok(())
    }

    /// A member's view of the step's results: its `len` rows from batch row `b0`, each with
    /// `width` floats of tapped states.
    fn view(
        &self,
        b0: usize,
        len: usize,
        width: usize,
        batch_forward: Option<(usize, f64)>,
    ) -> RoundOutput<'_> {
        let r = &self.results;
        RoundOutput {
            index: &r.index[b0..b0 + len],
            argmax: &r.argmax,
            top: &r.top,
            logits: &r.logits,
            vocab: r.vocab,
            hidden: self.scratch.out.hidden.get(b0 * width..).unwrap_or(&[]),
            batch_forward,
        }
    }

    /// Runs one step over `members`: at most `prefill_budget` prompt tokens in all (split in
    /// member order, so a long prompt is prefilled over several steps while the others keep
    /// decoding), every decoding member one round.
    pub fn step(
        &mut self,
        model: &Model,
        members: &mut [Member],
        prefill_budget: usize,
    ) -> Result<StepReport> {
        let n = members.len();
        let mut rep = StepReport {
            planned: vec![false; n],
            finished: vec![false; n],
            ..Default::default()
        };
        // Plan: prompt chunks first, then rounds, each sized for its share of a forward with
        // these prompt rows and this many decoding sessions (`Sizer::choose`).
        let mut budget = prefill_budget;
        let decoding: Vec<usize> = (0..n)
            .filter(|&i| !members[i].session.prefilling())
            .collect();
        for m in members.iter_mut().filter(|m| m.session.prefilling()) {
            if budget == 0 {
                break;
            }
            let take = m.session.prompt_left().min(budget);
            let _ = m.session.plan(m.kv, BatchShape::default(), take)?;
            budget -= take;
            rep.prefill_rows += take;
        }
        for (i, m) in members.iter().enumerate() {
            if m.session.prefilling() {
                rep.planned[i] = m.session.has_pending();
            }
        }
        let mut rows = rep.prefill_rows;
        let shape = BatchShape {
            streams: decoding.len(),
            prefill: rep.prefill_rows,
        };
        for &i in &decoding {
            let m = &mut members[i];
            if m.session.plan(m.kv, shape, 0)? {
                rep.planned[i] = true;
                rows += m.session.batch().tokens.len();
            } else {
                rep.finished[i] = true;
            }
        }
        rep.rows = rows;
        if rows == 0 {
            return Ok(rep);
        }
        // Output rows: argmaxes in one pass, full logits in a second pass over the same final
        // states (`Model::output_again`), each member's likely rows first; then, while a
        // member's verification reaches a row without results, that row and the likely ones
        // below it (usually no second round). Tapped states come with the forward.
        let taps = {
            let first = (0..n).find(|&i| rep.planned[i]).expect("a planned member");
            members[first].session.taps().to_vec()
        };
        let (mut arg_rows, mut full_rows) = (Vec::new(), Vec::new());
        // Argmax rows get the top `top_k` candidates too when a member's drafter wants them.
        let mut top_k = 0;
        // (member, batch row0, rows, its output kind)
        let mut at = Vec::with_capacity(n);
        let mut row = 0;
        for (i, m) in members.iter().enumerate().filter(|(i, _)| rep.planned[*i]) {
            if m.session.taps() != taps.as_slice() {
                return Err(Error::BadRequest(format!(
                    "member {i} taps other layers than the batch's first member"
                )));
            }
            let len = m.session.batch().tokens.len();
            let need = m.session.needs();
            let kind = Kind::of(need.logits);
            at.push((i, row, len, kind));
            let mine = need.rows.iter().filter(|&&r| r < len).map(|&r| row + r);
            match kind {
                Kind::Argmax => arg_rows.extend(mine),
                Kind::Full => full_rows.extend(mine),
                Kind::None => {}
            }
            if let Logits::ArgmaxTop(k) = need.logits {
                top_k = top_k.max(k);
            }
            row += len;
        }
        let t = std::time::Instant::now();
        {
            let mut seqs: Vec<(&mut KvCache, Batch)> = members
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| rep.planned[*i])
                .map(|(_, m)| (&mut *m.kv, m.session.batch()))
                .collect();
            let (first, logits) = match (arg_rows.is_empty(), full_rows.is_empty()) {
                (false, _) => (&arg_rows, argmax_logits(top_k)),
                (true, false) => (&full_rows, Logits::Full),
                (true, true) => (&arg_rows, Logits::None),
            };
            let spec = OutputSpec {
                rows: Rows::Some(first.clone()),
                logits,
                taps: taps.clone(),
            };
            model.forward_multi(&mut seqs, &spec, &mut self.scratch)?;
        }
        self.results.reset(rows);
        if !arg_rows.is_empty() {
            self.results.add(&arg_rows, &mut self.scratch.out, false);
            self.output(model, &[], &full_rows, top_k)?;
        } else if !full_rows.is_empty() {
            self.results.add(&full_rows, &mut self.scratch.out, true);
        }
        rep.output_rounds = 1;
        loop {
            let (mut arg, mut full) = (Vec::new(), Vec::new());
            for &(i, b0, len, kind) in &at {
                let o = self.view(b0, len, 0, None);
                let Some(more) = members[i].session.resolve(&o) else {
                    continue;
                };
                let new = more
                    .into_iter()
                    .filter(|&r| r < len && self.results.index[b0 + r] == NO_ROW)
                    .map(|r| b0 + r);
                match kind {
                    Kind::Argmax => arg.extend(new),
                    Kind::Full => full.extend(new),
                    Kind::None => {}
                }
            }
            if arg.is_empty() && full.is_empty() {
                break;
            }
            self.output(model, &arg, &full, top_k)?;
            rep.output_rounds += 1;
        }
        let forward_ms = t.elapsed().as_secs_f64() * 1e3;
        // Sizing learns batched forwards' cost from them (a lone session, from its rounds).
        let batch_forward = (at.len() > 1).then_some((rows, forward_ms));
        for (i, b0, len, _) in at {
            let m = &mut members[i];
            let w = m.session.width();
            let o = self.view(b0, len, w, batch_forward);
            m.session.commit(m.kv, o, &mut m.on_text)?;
            if m.session.stop_reason().is_some() {
                rep.finished[i] = true;
            }
        }
        Ok(rep)
    }
}

/// What a slot's owner does with the text its session commits.
pub trait TextSink {
    fn text(&mut self, piece: &str);
}

/// A session in flight with its cache and its owner's data.
pub struct Slot<'a, M> {
    pub kv: KvCache,
    pub session: Session<'a>,
    pub meta: M,
}

/// The sessions in flight and the [`Stepper`] that runs them: what the serving engine and the
/// batch generator both step (admission policy and retirement are theirs).
pub struct Slots<'a, M> {
    slots: Vec<Slot<'a, M>>,
    stepper: Stepper,
}

impl<M> Default for Slots<'_, M> {
    fn default() -> Self {
        Slots {
            slots: Vec::new(),
            stepper: Stepper::default(),
        }
    }
}

impl<'a, M: TextSink> Slots<'a, M> {
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn push(&mut self, kv: KvCache, session: Session<'a>, meta: M) {
        self.slots.push(Slot { kv, session, meta });
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Slot<'a, M>> {
        self.slots.iter()
    }

    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, Slot<'a, M>> {
        self.slots.iter_mut()
    }

    /// Removes the slots `leave` picks, in their order.
    pub fn remove_where(
        &mut self,
        mut leave: impl FnMut(&Slot<'a, M>) -> bool,
    ) -> Vec<Slot<'a, M>> {
        let mut gone = vec![];
        let mut i = 0;
        while i < self.slots.len() {
            if leave(&self.slots[i]) {
                gone.push(self.slots.remove(i));
            } else {
                i += 1;
            }
        }
        gone
    }

    /// Removes every slot (a failed step).
    pub fn drain(&mut self) -> Vec<Slot<'a, M>> {
        std::mem::take(&mut self.slots)
    }

    /// Gives back the step scratch (sized for the largest step so far), as when idle.
    pub fn shrink(&mut self) {
        self.stepper = Stepper::default();
    }

    /// One [`Stepper::step`] over every slot, each slot's text to its owner's sink.
    pub fn step(&mut self, model: &Model, prefill_budget: usize) -> Result<StepReport> {
        let mut sinks = Vec::with_capacity(self.slots.len());
        let mut parts = Vec::with_capacity(self.slots.len());
        for s in self.slots.iter_mut() {
            let Slot { kv, session, meta } = s;
            sinks.push(move |piece: &str| meta.text(piece));
            parts.push((kv, session));
        }
        let mut members: Vec<Member> = parts
            .into_iter()
            .zip(sinks.iter_mut())
            .map(|((kv, session), on_text)| Member {
                kv,
                session,
                on_text,
            })
            .collect();
        self.stepper.step(model, &mut members, prefill_budget)
    }

    /// Removes the slots `report` says have ended, in their order.
    pub fn take_finished(&mut self, report: &StepReport) -> Vec<Slot<'a, M>> {
        let mut i = 0;
        self.remove_where(|_| {
            i += 1;
            report.finished.get(i - 1).copied().unwrap_or(false)
        })
    }
}
