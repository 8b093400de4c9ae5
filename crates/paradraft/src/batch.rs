//! Continuous batching: many sequences, each with its own KV cache, advance together in one
//! multi-sequence forward per step ([`Model::forward_multi`]). New requests join as soon as a
//! slot frees up; their prompt is prefilled in the same forward in which the others decode a
//! token. Greedy only: each sequence's tokens equal those of [`crate::generate::generate`]
//! run on it alone (the forward is batch-invariant and both use the fused argmax).
//!
//! Used by self-distillation (training data at several times the single-stream rate) and meant
//! for the server's scheduler.

use crate::error::{Error, Result};
use crate::generate::StopReason;
use crate::kv::KvCache;
use crate::model::{Batch, Logits, Model, OutputSpec, Rows, Scratch};
use crate::types::{Pos, TokenId};
use half::f16;

/// A greedy generation request.
#[derive(Clone, Debug)]
pub struct Request {
    /// The caller's id, returned with the result.
    pub id: u64,
    pub prompt: Vec<TokenId>,
    pub max_new_tokens: usize,
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
    /// not among them when generation stopped right after producing it.
    pub features: Vec<f16>,
}

struct Active {
    req: Request,
    out: Vec<TokenId>,
    /// The prompt is not in the cache yet.
    prefill: bool,
    features: Vec<f16>,
}

/// The sequences in flight: one KV cache per slot, reused by the next request.
pub struct BatchGenerator<'m> {
    model: &'m Model,
    stop_tokens: Vec<TokenId>,
    slots: Vec<Option<Active>>,
    caches: Vec<KvCache>,
    scratch: Scratch,
    taps: Vec<usize>,
    /// Most prompt tokens prefilled in one step (bounds a step's latency); a prompt longer
    /// than this still gets a step of its own.
    pub max_prefill_tokens: usize,
}

impl<'m> BatchGenerator<'m> {
    /// `max_seqs` sequences at once, each with room for `ctx` tokens (prompt and output).
    pub fn new(model: &'m Model, stop_tokens: &[TokenId], max_seqs: usize, ctx: usize) -> Self {
        BatchGenerator {
            model,
            stop_tokens: stop_tokens.to_vec(),
            slots: (0..max_seqs.max(1)).map(|_| None).collect(),
            caches: (0..max_seqs.max(1)).map(|_| model.new_kv(ctx)).collect(),
            scratch: Scratch::default(),
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
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Whether a request can join now.
    pub fn has_room(&self) -> bool {
        self.slots.iter().any(|s| s.is_none())
    }

    /// Queues `req` in a free slot; a request that cannot fit its cache is refused, and one
    /// without a free slot is handed back.
    pub fn admit(&mut self, req: Request) -> Result<Option<Request>> {
        let cap = self.caches[0].capacity();
        if req.prompt.is_empty() {
            return Err(Error::BadRequest(format!(
                "request {}: empty prompt",
                req.id
            )));
        }
        if req.prompt.len() >= cap {
            return Err(Error::ContextOverflow {
                needed: req.prompt.len() + 1,
                capacity: cap,
            });
        }
        let Some(i) = self.slots.iter().position(|s| s.is_none()) else {
            return Ok(Some(req));
        };
        self.caches[i].clear();
        self.slots[i] = Some(Active {
            req,
            out: vec![],
            prefill: true,
            features: vec![],
        });
        Ok(None)
    }

    /// One forward over every sequence in flight (prompts waiting for their prefill join
    /// within the token budget); returns the requests that finished in it.
    pub fn step(&mut self) -> Result<Vec<Finished>> {
        // Which slots run this step: every decoding one, and prefills within the budget.
        let mut budget = self.max_prefill_tokens;
        let mut run = vec![];
        for (i, s) in self.slots.iter().enumerate() {
            let Some(a) = s else { continue };
            if a.prefill {
                let n = a.req.prompt.len();
                if n > budget && budget < self.max_prefill_tokens {
                    continue;
                }
                budget = budget.saturating_sub(n);
            }
            run.push(i);
        }
        if run.is_empty() {
            return Ok(vec![]);
        }
        let mut toks: Vec<Vec<TokenId>> = Vec::with_capacity(run.len());
        let mut pos: Vec<Vec<Pos>> = Vec::with_capacity(run.len());
        for &i in &run {
            let a = self.slots[i].as_ref().expect("running slot");
            let kv = &self.caches[i];
            if a.prefill {
                toks.push(a.req.prompt.clone());
                pos.push((0..a.req.prompt.len() as u32).map(Pos).collect());
            } else {
                toks.push(vec![*a.out.last().expect("a decoded token")]);
                pos.push(vec![Pos(kv.len() as u32)]);
            }
        }
        let mut last_rows = Vec::with_capacity(run.len());
        let mut r = 0;
        for t in &toks {
            r += t.len();
            last_rows.push(r - 1);
        }
        let spec = OutputSpec {
            rows: Rows::Some(last_rows),
            logits: Logits::Argmax,
            taps: self.taps.clone(),
        };
        let mut seqs: Vec<(&mut KvCache, Batch)> = Vec::with_capacity(run.len());
        let mut j = 0;
        for (i, kv) in self.caches.iter_mut().enumerate() {
            if run.get(j) == Some(&i) {
                seqs.push((
                    kv,
                    Batch {
                        tokens: &toks[j],
                        positions: &pos[j],
                        mask: None,
                    },
                ));
                j += 1;
            }
        }
        let out = self
            .model
            .forward_multi(&mut seqs, &spec, &mut self.scratch)?;
        let next: Vec<TokenId> = out.argmax.clone();
        let w = self.taps.len() * self.model.config.hidden_size;
        let mut done = vec![];
        let mut row = 0;
        for (j, &i) in run.iter().enumerate() {
            let a = self.slots[i].as_mut().expect("running slot");
            a.prefill = false;
            let rows = toks[j].len();
            a.features.extend(
                out.hidden[row * w..(row + rows) * w]
                    .iter()
                    .map(|&v| f16::from_f32(v)),
            );
            row += rows;
            let t = next[j];
            let stop = if a.out.len() >= a.req.max_new_tokens {
                Some(StopReason::MaxTokens)
            } else if self.stop_tokens.contains(&t) {
                Some(StopReason::StopToken)
            } else {
                a.out.push(t);
                if a.out.len() >= a.req.max_new_tokens {
                    Some(StopReason::MaxTokens)
                } else if self.caches[i].len() >= self.caches[i].capacity() {
                    Some(StopReason::ContextFull)
                } else {
                    None
                }
            };
            if let Some(stop_reason) = stop {
                let a = self.slots[i].take().expect("running slot");
                done.push(Finished {
                    id: a.req.id,
                    prompt: a.req.prompt,
                    tokens: a.out,
                    stop_reason,
                    features: a.features,
                });
            }
        }
        Ok(done)
    }
}

/// Runs `requests` through a [`BatchGenerator`] of `max_seqs` slots, admitting the next
/// request whenever a slot frees up; `on_done` sees each request as it finishes (in finishing
/// order, not request order).
/// `taps` as in [`BatchGenerator::with_taps`].
pub fn generate_greedy_batched(
    model: &Model,
    stop_tokens: &[TokenId],
    taps: &[usize],
    requests: impl IntoIterator<Item = Request>,
    max_seqs: usize,
    ctx: usize,
    mut on_done: impl FnMut(Finished) -> Result<()>,
) -> Result<()> {
    let mut g = BatchGenerator::new(model, stop_tokens, max_seqs, ctx).with_taps(taps)?;
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
