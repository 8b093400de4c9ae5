//! One forward for many sessions (continuous batching): every member plans its part (a chunk
//! of its prompt or a speculative round sized for its share of the batch), one multi-sequence
//! forward runs all their rows (each over its own cache, with its own tree mask), and each
//! member commits its results. A row's results are those it would get alone (the forward is
//! batch-invariant), so a session's tokens do not depend on what it was batched with.

use super::decode::{Prepared, RoundOutput, Session, Speculation};
use super::sizing::BatchShape;
use super::SharedPass;
use super::SpecGeneration;
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::{Batch, Logits, Model, OutputSpec, Rows, Scratch, Tokenizer};
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
    let mut session = Session::new(tok, kv, prompt, params, sp, &model.config)?;
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
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepReport {
    /// Where its time went, ms: planning (prompt chunks, sizing, drafters' own work), the
    /// drafters' shared passes, the forward (with its output passes), committing (verify,
    /// stream, tell the drafters).
    pub plan_ms: f64,
    pub pass_ms: f64,
    pub forward_ms: f64,
    pub commit_ms: f64,
    /// Per member: whether it took part (false: finished, or waiting for prefill budget).
    pub planned: Vec<bool>,
    /// Per member: it has ended (stopped or out of cache) and can be retired.
    pub finished: Vec<bool>,
    /// Rows of the forward (0: nothing ran).
    pub rows: usize,
    /// Prompt tokens among them.
    pub prefill_rows: usize,
}

/// Scratch kept between steps.
#[derive(Default)]
pub struct Stepper {
    scratch: Scratch,
    argmax: Vec<TokenId>,
    top: Vec<Vec<(TokenId, f32)>>,
}

impl Stepper {
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
        let t_plan = std::time::Instant::now();
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
        // Rounds in two phases: every session sizes its round and prepares its drafter, the
        // drafters' shared passes run once each (batched drafting: one network pass for every
        // session that asked its model), then every session takes its proposal.
        let (mut passes, mut drafting): (Vec<SharedPass>, _) = (vec![], vec![]);
        for &i in &decoding {
            let m = &mut members[i];
            match m.session.prepare(m.kv, shape, 0)? {
                Prepared::Over => rep.finished[i] = true,
                // A decoding session plans no prompt chunk; were it one, its rows are ready.
                Prepared::Planned => {
                    rep.planned[i] = true;
                    rows += m.session.batch().tokens.len();
                }
                Prepared::Drafting(pass) => {
                    if let Some(p) = pass.filter(|p| !passes.iter().any(|q| q.same(p))) {
                        passes.push(p);
                    }
                    drafting.push(i);
                }
            }
        }
        let t_pass = std::time::Instant::now();
        for p in &passes {
            p.run(model);
        }
        rep.pass_ms = t_pass.elapsed().as_secs_f64() * 1e3;
        for i in drafting {
            let m = &mut members[i];
            m.session.propose()?;
            rep.planned[i] = true;
            rows += m.session.batch().tokens.len();
        }
        rep.rows = rows;
        rep.plan_ms = t_plan.elapsed().as_secs_f64() * 1e3 - rep.pass_ms;
        if rows == 0 {
            return Ok(rep);
        }
        // Output rows: argmaxes in one pass, full logits in a second pass over the same final
        // states (`Model::output_again`); tapped states come with the forward.
        let taps = {
            let first = (0..n).find(|&i| rep.planned[i]).expect("a planned member");
            members[first].session.taps().to_vec()
        };
        let (mut arg_rows, mut full_rows) = (Vec::new(), Vec::new());
        // Argmax rows get the top `top_k` candidates too when a member's drafter wants them.
        let mut top_k = 0;
        // Full rows come from the 4-bit screen when every session asking for them would take
        // screened rows (`Logits::Screened`, greedy processed rows); one exact session makes
        // them all exact (both give the same choices: a row's exact values are re-scored).
        let mut screen = true;
        // (member, batch row0, argmax row0, full row0, whether its rows are argmax rows)
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
            let argmax_rows = matches!(need.logits, Logits::Argmax | Logits::ArgmaxTop(_));
            at.push((i, row, arg_rows.len(), full_rows.len(), argmax_rows));
            let mine = if need.last_only {
                row + len - 1..row + len
            } else {
                row..row + len
            };
            match need.logits {
                Logits::Argmax => arg_rows.extend(mine),
                Logits::ArgmaxTop(k) => {
                    arg_rows.extend(mine);
                    top_k = top_k.max(k);
                }
                Logits::Full => {
                    full_rows.extend(mine);
                    screen = false;
                }
                Logits::Screened => full_rows.extend(mine),
                _ => {}
            }
            row += len;
        }
        let forward_ms: f64;
        let (out, margin) = {
            let mut seqs: Vec<(&mut KvCache, Batch)> = members
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| rep.planned[*i])
                .map(|(_, m)| (&mut *m.kv, m.session.batch()))
                .collect();
            let full = if screen {
                Logits::Screened
            } else {
                Logits::Full
            };
            let first = match (arg_rows.is_empty(), top_k) {
                (true, _) => (&full_rows, full),
                (false, 0) => (&arg_rows, Logits::Argmax),
                (false, k) => (&arg_rows, Logits::ArgmaxTop(k)),
            };
            let logits = if first.0.is_empty() {
                Logits::None
            } else {
                first.1
            };
            let spec = OutputSpec {
                rows: Rows::Some(first.0.clone()),
                logits,
                taps: taps.clone(),
            };
            let t = std::time::Instant::now();
            model.forward_multi(&mut seqs, &spec, &mut self.scratch)?;
            if !arg_rows.is_empty() {
                self.argmax.clone_from(&self.scratch.out.argmax);
                self.top = std::mem::take(&mut self.scratch.out.top);
                if !full_rows.is_empty() {
                    let spec = OutputSpec {
                        rows: Rows::Some(full_rows.clone()),
                        logits: full,
                        taps: vec![],
                    };
                    model.output_again(&spec, &mut self.scratch)?;
                }
            } else {
                self.argmax.clear();
                self.top.clear();
            }
            forward_ms = t.elapsed().as_secs_f64() * 1e3;
            (&self.scratch.out, model.rescore_margin(full))
        };
        // The full rows' pass ran last, so its rows are the ones `Model::rescore` reads.
        let scratch = &self.scratch;
        // Sizing learns batched forwards' cost from them (a lone session, from its rounds).
        let batch_forward = (at.len() > 1).then_some((rows, forward_ms));
        rep.forward_ms = forward_ms;
        let t_commit = std::time::Instant::now();
        for (i, b0, a0, f0, argmax_rows) in at {
            let m = &mut members[i];
            let w = m.session.width();
            let o = RoundOutput {
                argmax: &self.argmax[a0.min(self.argmax.len())..],
                // Only a session whose rows are argmax rows has top lists.
                top: if argmax_rows {
                    &self.top[a0.min(self.top.len())..]
                } else {
                    &[]
                },
                logits: out.logits.get(f0 * out.vocab..).unwrap_or(&[]),
                vocab: out.vocab,
                hidden: out.hidden.get(b0 * w..).unwrap_or(&[]),
                batch_forward,
                exact: (&|r, t| model.rescore(scratch, f0 + r, t), margin),
            };
            m.session.commit(m.kv, o, &mut m.on_text)?;
            if m.session.stop_reason().is_some() {
                rep.finished[i] = true;
            }
        }
        rep.commit_ms = t_commit.elapsed().as_secs_f64() * 1e3;
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
