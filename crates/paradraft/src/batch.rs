//! Batched generation for self-distillation: many requests advance together, one
//! multi-sequence forward per step, with the tapped layers' outputs of every token captured on
//! the way (a drafter's training features for free). It is the server's path
//! ([`Session`]s stepped by a [`Stepper`]) with no drafter, so each sequence's tokens equal
//! those of [`crate::generate::generate`] run on it alone: greedy by default, or sampled at a
//! request's temperature from its seed.

use crate::error::{Error, Result};
use crate::model::{Model, Tokenizer};
use crate::request::{GenerateParams, StopReason};
use crate::sample::SamplingParams;
use crate::speculative::step::{Slots, TextSink};
use crate::speculative::{DraftTree, Drafter, Hidden, Outcome, Session, Speculation};
use crate::types::TokenId;
use half::f16;
use std::cell::RefCell;
use std::rc::Rc;

/// A generation request: greedy unless `sampling` says otherwise.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// The caller's id, returned with the result.
    pub id: u64,
    pub prompt: Vec<TokenId>,
    pub max_new_tokens: usize,
    /// Greedy by default; a temperature samples (seeded by the request's `seed`).
    pub sampling: SamplingParams,
}

/// A finished request.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    pub id: u64,
    pub prompt: Vec<TokenId>,
    /// Generated ids (a final stop token is not included, as in AR generation).
    pub tokens: Vec<TokenId>,
    pub stop_reason: StopReason,
    /// With taps: the tapped layers' outputs (`taps × hidden` per row, f16) of every token of
    /// `prompt ⧺ tokens` that went through the model, in order. The last generated token is
    /// not among them when generation stopped on the token budget (it was never fed back).
    pub features: Vec<f16>,
}

/// Proposes nothing and records the tapped states the session hands its drafter: the prompt's
/// in `begin`, each fed token's in `observe`.
struct FeatureTap {
    taps: Vec<usize>,
    out: Rc<RefCell<Vec<f16>>>,
}

impl FeatureTap {
    fn record(&self, hidden: Hidden) {
        self.out
            .borrow_mut()
            .extend(hidden.rows.iter().map(|&v| f16::from_f32(v)));
    }
}

impl Drafter for FeatureTap {
    fn name(&self) -> &str {
        "feature-tap"
    }
    fn taps(&self) -> &[usize] {
        &self.taps
    }
    fn begin(&mut self, _: &[TokenId], hidden: Hidden) -> Result<()> {
        self.record(hidden);
        Ok(())
    }
    fn propose(&mut self, _: &[TokenId], _: usize) -> Result<DraftTree> {
        Ok(DraftTree::new())
    }
    fn observe(&mut self, _: &Outcome, hidden: Hidden) -> Result<()> {
        self.record(hidden);
        Ok(())
    }
}

/// What the generator keeps of a request besides its session.
struct Tag {
    id: u64,
    prompt: Vec<TokenId>,
    features: Rc<RefCell<Vec<f16>>>,
}

/// Self-distillation keeps the tokens, not the text.
impl TextSink for Tag {
    fn text(&mut self, _: &str) {}
}

/// The sequences in flight.
pub struct BatchGenerator<'m> {
    model: &'m Model,
    tok: &'m Tokenizer,
    max_seqs: usize,
    ctx: usize,
    slots: Slots<'m, Tag>,
    taps: Vec<usize>,
    /// Most prompt tokens prefilled in one step (bounds a step's latency); longer prompts are
    /// prefilled in chunks over several steps.
    pub max_prefill_tokens: usize,
}

impl<'m> BatchGenerator<'m> {
    /// `max_seqs` sequences at once, each with room for `ctx` tokens (prompt and output); the
    /// tokenizer's stop tokens end a sequence.
    pub fn new(model: &'m Model, tok: &'m Tokenizer, max_seqs: usize, ctx: usize) -> Self {
        BatchGenerator {
            model,
            tok,
            max_seqs: max_seqs.max(1),
            ctx,
            slots: Slots::default(),
            taps: vec![],
            max_prefill_tokens: 2048,
        }
    }

    /// Also returns these layers' outputs for every token (a drafter's training features,
    /// captured for free while generating).
    pub fn with_taps(mut self, taps: &[usize]) -> Result<Self> {
        if let Some(&t) = taps.iter().find(|&&t| t >= self.model.config.n_layers) {
            return Err(Error::BadRequest(format!(
                "tap layer {t} does not exist ({} layers)",
                self.model.config.n_layers
            )));
        }
        self.taps = taps.to_vec();
        Ok(self)
    }

    /// Sequences in flight.
    pub fn active(&self) -> usize {
        self.slots.len()
    }

    /// Whether a request can join now.
    pub fn has_room(&self) -> bool {
        self.slots.len() < self.max_seqs
    }

    /// Starts `req`; a request that cannot fit its cache is refused, and one without a free
    /// slot is handed back.
    pub fn admit(&mut self, req: Request) -> Result<Option<Request>> {
        if !self.has_room() {
            return Ok(Some(req));
        }
        let features = Rc::new(RefCell::new(Vec::new()));
        let sp = Speculation {
            drafter: Box::new(FeatureTap {
                taps: self.taps.clone(),
                out: features.clone(),
            }),
            max_draft: 0,
            sizer: None,
            rule: Default::default(),
        };
        let params = GenerateParams {
            max_new_tokens: req.max_new_tokens,
            sampling: req.sampling,
            stop_strings: vec![],
            ..Default::default()
        };
        let mut kv = self.model.new_kv(self.ctx);
        let session = Session::new(
            self.tok,
            &mut kv,
            &req.prompt,
            &params,
            sp,
            &self.model.config,
        )
        .map_err(|e| e.context(format!("request {}", req.id)))?;
        let tag = Tag {
            id: req.id,
            prompt: req.prompt,
            features,
        };
        self.slots.push(kv, session, tag);
        Ok(None)
    }

    /// One forward over every sequence in flight (prompts are prefilled within the token
    /// budget); returns the requests that finished in it.
    pub fn step(&mut self) -> Result<Vec<Finished>> {
        if self.slots.is_empty() {
            return Ok(vec![]);
        }
        let report = self.slots.step(self.model, self.max_prefill_tokens)?;
        let done = self.slots.take_finished(&report).into_iter().map(|s| {
            let g = s.session.finish(&mut |_| {});
            let features = std::mem::take(&mut *s.meta.features.borrow_mut());
            Finished {
                id: s.meta.id,
                prompt: s.meta.prompt,
                tokens: g.out.token_ids,
                stop_reason: g.out.stop_reason,
                features,
            }
        });
        Ok(done.collect())
    }
}

/// Runs `requests` through a [`BatchGenerator`] of `max_seqs` slots, admitting the next
/// request whenever a slot frees up; `on_done` sees each request as it finishes (in finishing
/// order, not request order). `taps` as in [`BatchGenerator::with_taps`].
#[allow(clippy::too_many_arguments)]
pub fn generate_batched(
    model: &Model,
    tok: &Tokenizer,
    taps: &[usize],
    requests: impl IntoIterator<Item = Request>,
    max_seqs: usize,
    ctx: usize,
    mut on_done: impl FnMut(Finished) -> Result<()>,
) -> Result<()> {
    let mut g = BatchGenerator::new(model, tok, max_seqs, ctx).with_taps(taps)?;
    let mut reqs = requests.into_iter();
    loop {
        while g.has_room() {
            let Some(r) = reqs.next() else { break };
            let back = g.admit(r)?;
            debug_assert!(back.is_none(), "a slot was free");
        }
        if g.active() == 0 {
            return Ok(());
        }
        for f in g.step()? {
            on_done(f)?;
        }
    }
}
