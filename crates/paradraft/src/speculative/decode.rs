//! The speculative decode loop (gpt-fast style: the whole algorithm on one screen), as a
//! per-request state machine ([`Session`]) so that one forward can serve several requests.
//!
//! A round verifies [root, draft nodes] in one target forward, keeps the KV rows of the root
//! and the accepted path, and commits the accepted tokens plus the target's bonus token, which
//! becomes the next root.

use super::sizing::Sizer;
use super::tree::{DraftTree, Linearised, NodeId};
use super::verify::{row_of, verify, Outcome, VerifyRule};
use super::{Drafter, Hidden};
use crate::error::Result;
use crate::generate::{check_prompt, Emitter, GenerateParams, Generation, Stats, StopReason};
use crate::kv::KvCache;
use crate::model::{Batch, Logits, Model, Output, OutputSpec, Rows, Scratch, Tokenizer};
use crate::sample::Sampler;
use crate::types::{Pos, SlotId, TokenId};
use serde::Serialize;
use std::time::Instant;

/// Telemetry of one round.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RoundStats {
    pub drafted: usize,
    pub accepted: usize,
    pub draft_ms: f64,
    /// Linearising the tree (positions, ancestor mask).
    pub tree_ms: f64,
    pub verify_ms: f64,
    pub commit_ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SpecGeneration {
    /// What AR generation reports too.
    #[serde(flatten)]
    pub out: Generation,
    /// Target forwards after the prefill.
    pub rounds: Vec<RoundStats>,
    /// Tokens committed per target pass, bonus included (prefill's token not counted).
    pub tau: f64,
}

/// The drafter of a speculative run, the most nodes it may propose per round, optionally a
/// [`Sizer`] that picks each round's budget from measured costs and acceptance, and the rule
/// that verifies drafts at temperature > 0.
pub struct Speculation<'a> {
    pub drafter: &'a mut dyn Drafter,
    pub max_draft: usize,
    pub sizer: Option<&'a mut Sizer>,
    pub rule: VerifyRule,
}

/// Generates a continuation of `prompt`, drafting with `sp.drafter` and verifying each draft
/// in one target forward: one [`Session`] driven to its end.
pub fn speculative_generate<'a>(
    model: &Model,
    tok: &'a Tokenizer,
    kv: &mut KvCache,
    prompt: &[TokenId],
    params: &'a GenerateParams,
    sp: Speculation<'a>,
    mut on_text: impl FnMut(&str),
) -> Result<SpecGeneration> {
    let mut scratch = Scratch::default();
    let mut session = Session::start(
        model,
        tok,
        kv,
        &mut scratch,
        prompt,
        params,
        sp,
        &mut on_text,
    )?;
    while session.plan(kv)? {
        let out = model.forward(kv, &session.batch(), session.output_spec(), &mut scratch)?;
        session.commit(kv, out, 0, &mut on_text)?;
    }
    Ok(session.finish(&mut on_text))
}

/// A round in flight: what was drafted and linearised, waiting for the target's forward.
struct Pending {
    tree: DraftTree,
    lin: Linearised,
    /// Σ path probability of the nodes kept (trees cut by the sizer).
    predicted: f64,
    stats: RoundStats,
    verify_start: Instant,
}

/// One request's speculative decoding as a state machine: [`Session::start`] (prefill, first
/// token, the drafter's prefill), then per round [`Session::plan`] (draft, size, linearise: the
/// rows this request adds to a forward), the caller's forward over [`Session::batch`] (alone, or
/// with other sessions' rows), and [`Session::commit`] (verify, keep the accepted K/V, stream,
/// tell the drafter). Without a drafter it is AR decoding.
///
/// Invariant between rounds: the KV cache holds every committed token but the last one (the
/// root), whose position is `kv.len()`.
pub struct Session<'a> {
    drafter: &'a mut dyn Drafter,
    max_draft: usize,
    sizer: Option<&'a mut Sizer>,
    rule: VerifyRule,
    sampler: Sampler,
    emitter: Emitter<'a>,
    verify_spec: OutputSpec,
    width: usize,
    prompt_len: usize,
    /// The prompt and every committed token (its last one is the root).
    committed: Vec<TokenId>,
    root: TokenId,
    stop: Option<StopReason>,
    rounds: Vec<RoundStats>,
    pending: Option<Pending>,
    hidden: Vec<f32>,
    prefill_ms: f64,
    draft_prefill_ms: f64,
    decode_start: Instant,
}

impl<'a> Session<'a> {
    /// Prefills `prompt` into `kv` (cleared first), samples the first token and starts the
    /// drafter on the prompt.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        model: &Model,
        tok: &'a Tokenizer,
        kv: &mut KvCache,
        scratch: &mut Scratch,
        prompt: &[TokenId],
        params: &'a GenerateParams,
        sp: Speculation<'a>,
        on_text: &mut impl FnMut(&str),
    ) -> Result<Self> {
        let Speculation {
            drafter,
            max_draft,
            sizer,
            rule,
        } = sp;
        let sampler = Sampler::new(params.sampling)?;
        check_prompt(prompt, kv.capacity())?;
        kv.clear();
        let taps = drafter.taps().to_vec();
        let width = taps.len() * model.config.hidden_size;
        let t0 = Instant::now();
        let pos: Vec<Pos> = (0..prompt.len() as u32).map(Pos).collect();
        let spec = OutputSpec {
            taps: taps.clone(),
            ..OutputSpec::last_full()
        };
        let batch = Batch {
            tokens: prompt,
            positions: &pos,
            mask: None,
        };
        let out = model.forward(kv, &batch, &spec, scratch)?;
        let root = sampler.sample_at(out.logits_row(0), prompt.len());
        let prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        drafter.begin(
            prompt,
            Hidden {
                width,
                rows: &out.hidden,
            },
        )?;
        let draft_prefill_ms = t.elapsed().as_secs_f64() * 1e3;
        // Every verification forward: all rows, argmaxes (greedy) or full rows (sampling), taps.
        let greedy = params.sampling.is_greedy();
        let verify_spec = OutputSpec {
            rows: Rows::All,
            logits: if greedy { Logits::Argmax } else { Logits::Full },
            taps,
        };
        let mut emitter = Emitter::new(tok, params);
        let stop = emitter.push(root, on_text)?;
        let mut committed = prompt.to_vec();
        committed.push(root);
        Ok(Session {
            drafter,
            max_draft,
            sizer,
            rule,
            sampler,
            emitter,
            verify_spec,
            width,
            prompt_len: prompt.len(),
            committed,
            root,
            stop,
            rounds: Vec::new(),
            pending: None,
            hidden: Vec::new(),
            prefill_ms,
            draft_prefill_ms,
            decode_start: Instant::now(),
        })
    }

    /// Why the session stopped, once it has.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop
    }

    /// Drafts the next round (sized by the sizer, cut to the cache's room) and linearises
    /// [root, nodes]; `false` when the session is over (stopped or its cache is full).
    pub fn plan(&mut self, kv: &KvCache) -> Result<bool> {
        if self.stop.is_some() {
            return Ok(false);
        }
        let base = kv.len(); // the root's slot and position
        if kv.capacity() <= base {
            self.stop = Some(StopReason::ContextFull);
            return Ok(false);
        }
        let room = kv.capacity() - (base + 1);
        let mut stats = RoundStats::default();
        let trees = self.drafter.node_confidence().is_some();
        let budget = match self.sizer.as_deref() {
            Some(s) if trees => s.choose_tree(self.max_draft),
            Some(s) => s.choose(self.max_draft),
            None => self.max_draft,
        }
        .min(room);
        let t = Instant::now();
        let mut tree = self.drafter.propose(&self.committed, budget)?;
        stats.draft_ms = t.elapsed().as_secs_f64() * 1e3;
        // Trees: cut where nodes stop paying; `predicted` = Σ path probability of those kept.
        let mut predicted = 0.0;
        if let (Some(s), Some(conf)) = (self.sizer.as_deref(), self.drafter.node_confidence()) {
            let keep = s.cut(conf, stats.draft_ms).min(budget);
            predicted = conf[..keep.min(conf.len())].iter().map(|&p| p as f64).sum();
            tree.truncate(keep);
        }
        tree.truncate(budget);
        let t = Instant::now();
        let lin = tree.linearise(self.root, base);
        stats.tree_ms = t.elapsed().as_secs_f64() * 1e3;
        self.pending = Some(Pending {
            tree,
            lin,
            predicted,
            stats,
            verify_start: Instant::now(),
        });
        Ok(true)
    }

    /// The planned round's rows: [root, draft nodes] with their positions and tree mask.
    pub fn batch(&self) -> Batch<'_> {
        let lin = &self.pending.as_ref().expect("a planned round").lin;
        Batch {
            tokens: &lin.tokens,
            positions: &lin.positions,
            mask: Some(&lin.mask),
        }
    }

    /// What the verification forward must return for this session's rows.
    pub fn output_spec(&self) -> &OutputSpec {
        &self.verify_spec
    }

    /// Verifies the planned round against the forward's output (this session's rows start at
    /// output row `row0`), keeps the K/V of the root and the accepted path, streams the
    /// committed tokens and tells the drafter and the sizer.
    pub fn commit(
        &mut self,
        kv: &mut KvCache,
        out: &Output,
        row0: usize,
        on_text: &mut impl FnMut(&str),
    ) -> Result<()> {
        let Pending {
            tree,
            lin,
            predicted,
            mut stats,
            verify_start,
        } = self.pending.take().expect("a planned round");
        let base = lin.positions[0].0 as usize;
        let outcome: Outcome = verify(
            self.rule,
            &tree,
            out.argmax.get(row0..).unwrap_or(&[]),
            |r| out.logits_row(row0 + r),
            &self.sampler,
            base,
        );
        stats.verify_ms = verify_start.elapsed().as_secs_f64() * 1e3;

        // Commit: keep the root's slot and the accepted path's, contiguously.
        let t = Instant::now();
        let slots: Vec<SlotId> = outcome
            .accepted
            .iter()
            .map(|&n: &NodeId| SlotId((base + row_of(Some(n))) as u32))
            .collect();
        kv.compact(base + 1, &slots)?;
        for tok in outcome.committed() {
            self.committed.push(tok);
            if self.stop.is_none() {
                self.stop = self.emitter.push(tok, on_text)?;
            }
        }
        self.root = outcome.bonus;
        // Hidden states of the rows now committed: the root (row 0) and the accepted nodes.
        let w = self.width;
        self.hidden.clear();
        for row in std::iter::once(0).chain(outcome.accepted.iter().map(|&n| row_of(Some(n)))) {
            let r = row0 + row;
            self.hidden
                .extend_from_slice(&out.hidden[r * w..(r + 1) * w]);
        }
        self.drafter.observe(
            &outcome,
            Hidden {
                width: w,
                rows: &self.hidden,
            },
        )?;
        let trees = self.drafter.node_confidence().is_some();
        match self.sizer.as_deref_mut() {
            Some(s) if trees => s.observe_tree(
                tree.len(),
                predicted,
                outcome.accepted.len(),
                stats.draft_ms,
            ),
            Some(s) => s.observe(
                tree.max_depth() as usize,
                outcome.accepted.len(),
                stats.draft_ms,
                tree.len(),
            ),
            None => {}
        }
        stats.drafted = outcome.drafted;
        stats.accepted = outcome.accepted.len();
        stats.commit_ms = t.elapsed().as_secs_f64() * 1e3;
        self.rounds.push(stats);
        Ok(())
    }

    /// The generation: text, ids, stop reason, statistics and per-round telemetry.
    pub fn finish(self, on_text: &mut impl FnMut(&str)) -> SpecGeneration {
        let decode_ms = self.decode_start.elapsed().as_secs_f64() * 1e3;
        let (text, ids) = self.emitter.finish(on_text);
        let rounds = self.rounds;
        let tau = if rounds.is_empty() {
            0.0
        } else {
            rounds.iter().map(|r| r.accepted as f64 + 1.0).sum::<f64>() / rounds.len() as f64
        };
        SpecGeneration {
            out: Generation {
                text,
                stats: Stats::new(
                    self.prompt_len,
                    ids.len(),
                    self.prefill_ms,
                    self.draft_prefill_ms,
                    decode_ms,
                ),
                prompt_token_ids: self.committed[..self.prompt_len].to_vec(),
                stop_reason: self.stop.unwrap_or(StopReason::MaxTokens),
                token_ids: ids,
            },
            rounds,
            tau,
        }
    }
}
