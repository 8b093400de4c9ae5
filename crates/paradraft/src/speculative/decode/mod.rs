//! The speculative decode loop (gpt-fast style: the whole algorithm on one screen), as a
//! per-request state machine ([`Session`]) so that one forward can serve several requests.
//!
//! A round verifies [root, draft nodes] in one target forward, keeps the KV rows of the root
//! and the accepted path, and commits the accepted tokens plus the target's bonus token, which
//! becomes the next root.

use super::sizing::{BatchShape, RoundFacts, RoundResult, Sizer, Sizing};
use super::tree::{DraftTree, Linearised, NodeId};
use super::verify::{row_of, verify, Candidates, Outcome, VerifyRule};
use super::{Drafter, Hidden, RoundStats, SharedPass, SpecGeneration};
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::{Batch, Config, Logits, Tokenizer};
use crate::process::{Exact, Processor, TokenLogprob};
use crate::request::{check_prompt, Emitter, GenerateParams, Generation, Stats, StopReason};
use crate::runtime::ops;
use crate::sample::Sampler;
use crate::types::{Pos, SlotId, TokenId};
use std::time::Instant;

mod plan;
pub use plan::Prepared;
use plan::{Drafting, Pending, Planned};

/// The drafter of a speculative run, the most nodes it may propose per round, optionally a
/// [`Sizer`] that picks each round's budget from measured costs and acceptance, and the rule
/// that verifies drafts at temperature > 0. A session owns them (a server gives each request
/// its own; `&mut D` is a drafter too, for callers that keep theirs).
pub struct Speculation<'a> {
    pub drafter: Box<dyn Drafter + 'a>,
    pub max_draft: usize,
    pub sizer: Option<Sizer>,
    pub rule: VerifyRule,
}

/// What a session's rows need from the output layer of the forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowNeeds {
    /// `Logits::None`: nothing (a prompt chunk that is not the last).
    pub logits: Logits,
    /// Only the last row (the prompt's last chunk), else every row.
    pub last_only: bool,
}

/// The forward's results for one session's rows.
#[derive(Clone, Copy)]
pub struct RoundOutput<'o> {
    /// One per output row (when the session's rows asked for argmaxes).
    pub argmax: &'o [TokenId],
    /// One per output row: the best ids, best first (when they asked for
    /// `Logits::ArgmaxTop`).
    pub top: &'o [Vec<(TokenId, f32)>],
    /// `output rows × vocab` (when they asked for full logits).
    pub logits: &'o [f32],
    pub vocab: usize,
    /// The tapped states of the session's batch rows (`rows × width`).
    pub hidden: &'o [f32],
    /// The forward these rows came from when it held other sessions' rows too: its rows in
    /// all (prompt rows included) and its ms, so that sizing learns what batched forwards cost.
    pub batch_forward: Option<(usize, f64)>,
    /// The exact logit of a token at one of the session's full-logit rows (row, token), and
    /// how far below a row's best value its exact argmax may lie (`Model::rescore`,
    /// `Model::rescore_margin`): a processed greedy row is chosen on exact values.
    pub exact: Exact<'o>,
}

impl<'o> RoundOutput<'o> {
    pub fn logits_row(&self, r: usize) -> &'o [f32] {
        &self.logits[r * self.vocab..(r + 1) * self.vocab]
    }
}

/// The best `k` ids of each of `rows` verified rows, from the forward's top lists (greedy
/// rounds) or from the rows' full logits (sampling rounds); empty when `k` is 0.
fn candidates(k: usize, rows: usize, greedy: bool, o: &RoundOutput) -> Candidates {
    let mut ids = Vec::with_capacity(k * rows);
    for r in (0..rows).take_while(|_| k > 0) {
        match (greedy, o.top.get(r)) {
            (true, Some(t)) => ids.extend(t.iter().map(|e| e.0).take(k)),
            (false, _) if o.logits.len() >= (r + 1) * o.vocab => {
                ids.extend(ops::top_k(o.logits_row(r), k).iter().map(|e| e.0))
            }
            _ => return Candidates::default(),
        }
        // A vocabulary smaller than k repeats its best id.
        let last = *ids.last().unwrap_or(&TokenId(0));
        ids.resize(k * (r + 1), last);
    }
    Candidates { k, ids }
}

/// One request's speculative decoding as a state machine. [`Session::new`] checks the request;
/// then each step [`Session::plan`] says what the session adds to a forward (a chunk of its
/// prompt, or a round: draft, size, linearise), the caller runs a forward over
/// [`Session::batch`] (alone, or with other sessions' rows) producing [`Session::needs`], and
/// [`Session::commit`] takes the results (the prompt's last chunk: the first token and the
/// drafter's prefill; a round: verify, keep the accepted K/V, stream, tell the drafter).
/// Without a drafter it is AR decoding.
///
/// Invariant between rounds: the KV cache holds every committed token but the last one (the
/// root), whose position is `kv.len()`.
pub struct Session<'a> {
    drafter: Box<dyn Drafter + 'a>,
    max_draft: usize,
    sizing: Sizing,
    rule: VerifyRule,
    sampler: Sampler,
    emitter: Emitter<'a>,
    taps: Vec<usize>,
    greedy: bool,
    width: usize,
    prompt_len: usize,
    /// Prompt tokens whose K/V are in the cache.
    prefilled: usize,
    /// After a preemption ([`Session::preempt`]): committed tokens whose K/V are back in the
    /// cache, of the tokens it must hold again (all committed but the root).
    rebuild: Option<(usize, usize)>,
    /// The prompt and every committed token (its last one is the root once prefilled).
    committed: Vec<TokenId>,
    root: TokenId,
    stop: Option<StopReason>,
    rounds: Vec<RoundStats>,
    pending: Option<Pending>,
    /// A round [`Session::prepare`]d, for [`Session::propose`].
    drafting: Option<Drafting>,
    /// The prompt's tapped states, gathered chunk by chunk for the drafter's `begin`; then the
    /// states of each round's committed rows.
    hidden: Vec<f32>,
    prefill_start: Option<Instant>,
    prefill_ms: f64,
    draft_prefill_ms: f64,
    decode_start: Instant,
    /// Bias, penalties and log-probabilities, when the request asks for any.
    process: Option<Processor>,
    /// Each output token's log-probabilities (when asked for), in output order.
    logprobs: Vec<TokenLogprob>,
}

impl<'a> Session<'a> {
    /// A request for a model of shape `config` whose K/V go to `kv` (cleared).
    pub fn new(
        tok: &'a Tokenizer,
        kv: &mut KvCache,
        prompt: &[TokenId],
        params: &GenerateParams,
        sp: Speculation<'a>,
        config: &Config,
    ) -> Result<Self> {
        let Speculation {
            drafter,
            max_draft,
            sizer,
            rule,
        } = sp;
        let sampler = Sampler::new(params.sampling)?;
        let greedy = params.sampling.is_greedy();
        let process = Processor::new(&params.processing, prompt, config.vocab_size, tok, greedy)?;
        check_prompt(prompt, kv.capacity())?;
        kv.clear();
        let taps = drafter.taps().to_vec();
        Ok(Session {
            max_draft,
            sizing: Sizing::new(sizer),
            rule,
            sampler,
            emitter: Emitter::new(tok, params),
            width: taps.len() * config.hidden_size,
            taps,
            drafter,
            greedy,
            prompt_len: prompt.len(),
            prefilled: 0,
            rebuild: None,
            committed: prompt.to_vec(),
            root: TokenId(0),
            stop: None,
            rounds: Vec::new(),
            pending: None,
            drafting: None,
            hidden: Vec::new(),
            prefill_start: None,
            prefill_ms: 0.0,
            draft_prefill_ms: 0.0,
            decode_start: Instant::now(),
            process,
            logprobs: Vec::new(),
        })
    }

    /// Why the session stopped, once it has.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop
    }

    /// Starts from a cached prefix of the prompt: `kv` already holds the K/V of its first `n`
    /// tokens (`n` < the prompt's length, so the last is still computed and gives the first
    /// token) and `hidden` their tapped states (`n × width`). Exact: a prefix's K/V and states
    /// do not depend on what follows it, nor on the batch that computed them. A preempted
    /// session rebuilding its cache takes the first `n` of [`Session::to_fill`] so (their
    /// states are not needed: its drafter has seen them).
    pub fn skip_prefill(&mut self, kv: &KvCache, n: usize, hidden: &[f32]) -> Result<()> {
        if let Some((done, target)) = self.rebuild {
            if done != 0 || n > target || kv.len() != n {
                return Err(Error::BadRequest(format!(
                    "a cached prefix of {n} tokens does not fit this request's rebuild ({target} tokens, {} in its cache)",
                    kv.len()
                )));
            }
            self.rebuild = (n < target).then_some((n, target));
            return Ok(());
        }
        if self.prefilled != 0
            || n >= self.prompt_len
            || kv.len() != n
            || hidden.len() != n * self.width
        {
            return Err(Error::BadRequest(format!(
                "a cached prefix of {n} tokens does not fit this request ({} prompt tokens, {} in its cache)",
                self.prompt_len,
                kv.len()
            )));
        }
        self.prefilled = n;
        self.hidden.clear();
        self.hidden.extend_from_slice(hidden);
        Ok(())
    }

    /// The prompt.
    pub fn prompt(&self) -> &[TokenId] {
        &self.committed[..self.prompt_len]
    }

    /// The prompt's tapped states (`prompt × width`), from the end of its prefill until the
    /// first round commits; `None` otherwise.
    pub fn prompt_states(&self) -> Option<&[f32]> {
        (!self.prefilling()
            && self.rounds.is_empty()
            && self.hidden.len() == self.prompt_len * self.width)
            .then_some(&self.hidden[..])
    }

    /// Whether its prompt is still (partly) outside the cache, or after a preemption its
    /// committed tokens.
    pub fn prefilling(&self) -> bool {
        self.prefilled < self.prompt_len || self.rebuild.is_some()
    }

    /// The tokens whose K/V the cache must hold before the session can go on: the prompt
    /// while it is prefilled, every committed token but the root after a preemption, none
    /// otherwise.
    pub fn to_fill(&self) -> &[TokenId] {
        match self.rebuild {
            Some((_, target)) => &self.committed[..target],
            None if self.prefilling() => self.prompt(),
            None => &[],
        }
    }

    /// Most rows a round may verify: the root and the drafter's limit of nodes.
    pub fn max_round_rows(&self) -> usize {
        self.max_draft + 1
    }

    /// Gives up the cache between steps (`kv` is cleared, its pages go back): a prompt being
    /// prefilled starts over; a decoding session rebuilds the K/V of its committed tokens when
    /// it steps again (it is [`Session::prefilling`] until they are back: chunks of
    /// [`Session::to_fill`]), then goes on as if never stopped — a token's K/V do not depend on
    /// the forward that computed them, and its drafter, sampler and stops kept their state, so
    /// its output is the same at any temperature.
    pub fn preempt(&mut self, kv: &mut KvCache) -> Result<()> {
        let rebuild = self.committed.len() - 1;
        if self.pending.is_some() || (!self.prefilling() && kv.len() != rebuild) {
            return Err(Error::BadRequest(
                "a session can be preempted only between steps".into(),
            ));
        }
        kv.clear();
        if self.prefilled < self.prompt_len {
            self.prefilled = 0;
            self.hidden.clear();
        } else {
            self.rebuild = (rebuild > 0).then_some((0, rebuild));
        }
        Ok(())
    }

    /// Whether a step is planned and waits for its forward.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Prompt tokens not in the cache yet (after a preemption: committed tokens).
    pub fn prompt_left(&self) -> usize {
        match self.rebuild {
            Some((done, target)) => target - done,
            None => self.prompt_len - self.prefilled,
        }
    }

    /// The target layers whose outputs every forward of this session must tap.
    pub fn taps(&self) -> &[usize] {
        &self.taps
    }

    /// Floats of tapped states per row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Output tokens so far (a stop token and anything committed after the stop are not).
    pub fn generated(&self) -> usize {
        self.emitter.len()
    }

    /// The drafter's name.
    pub fn drafter_name(&self) -> &str {
        self.drafter.name()
    }

    /// Takes the forward's results for the planned rows: a prompt chunk's tapped states (and
    /// after the last chunk the first token and the drafter's prefill), or a round's
    /// verification (keep the K/V of the root and the accepted path, stream the committed
    /// tokens, tell the drafter and the sizer).
    pub fn commit(
        &mut self,
        kv: &mut KvCache,
        o: RoundOutput,
        on_text: &mut impl FnMut(&str),
    ) -> Result<()> {
        match self.pending.take().expect("a planned step") {
            Pending::Prefill { n, .. } => self.commit_prefill(n, o, on_text),
            Pending::Rebuild { from, n, .. } => {
                if let Some((_, target)) = self.rebuild {
                    self.rebuild = (from + n < target).then_some((from + n, target));
                }
                Ok(())
            }
            Pending::Round(p) => self.commit_round(kv, p, o, on_text),
        }
    }

    fn commit_prefill(
        &mut self,
        n: usize,
        o: RoundOutput,
        on_text: &mut impl FnMut(&str),
    ) -> Result<()> {
        self.hidden.extend_from_slice(&o.hidden[..n * self.width]);
        self.prefilled += n;
        if self.prefilling() {
            return Ok(());
        }
        // The first token's row, processed when the request asks for processing.
        let (root, lp) = match &mut self.process {
            Some(p) => {
                let mut first = o.logits_row(0).to_vec();
                p.first(&mut first);
                let root = self.sampler.sample_at(&first, self.prompt_len);
                (root, p.logprob(&first, root))
            }
            None => (
                self.sampler.sample_at(o.logits_row(0), self.prompt_len),
                None,
            ),
        };
        self.root = root;
        let start = self.prefill_start.unwrap_or_else(Instant::now);
        self.prefill_ms = start.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let hidden = std::mem::take(&mut self.hidden);
        self.drafter.begin(
            &self.committed,
            Hidden {
                width: self.width,
                rows: &hidden,
            },
        )?;
        self.hidden = hidden;
        self.draft_prefill_ms = t.elapsed().as_secs_f64() * 1e3;
        self.push(self.root, lp, on_text)?;
        self.decode_start = Instant::now();
        Ok(())
    }

    fn commit_round(
        &mut self,
        kv: &mut KvCache,
        p: Planned,
        o: RoundOutput,
        on_text: &mut impl FnMut(&str),
    ) -> Result<()> {
        let Planned {
            tree,
            grafted,
            lin,
            facts,
            predicted,
            mut stats,
            verify_start,
        } = p;
        let base = lin.positions[0].0 as usize;
        let (mut outcome, logprobs) = self.verify_processed(&tree, &o, base)?;
        outcome.top = candidates(self.drafter.candidates(), tree.len() + 1, self.greedy, &o);
        stats.verify_ms = verify_start.elapsed().as_secs_f64() * 1e3;

        let t = Instant::now();
        self.accept(kv, base, &outcome, logprobs, on_text)?;
        self.gather_hidden(&o, &outcome);
        let hidden = Hidden {
            width: self.width,
            rows: &self.hidden,
        };
        // The drafter and the sizer hear of the drafter's own nodes.
        let mine = grafted.as_ref().map(|g| g.drafter_outcome(&outcome));
        self.drafter
            .observe(mine.as_ref().unwrap_or(&outcome), hidden)?;
        stats.drafted = outcome.drafted;
        stats.accepted = outcome.accepted.len();
        stats.path = outcome.accepted.iter().map(|n| n.0).collect();
        let drafted = grafted.as_ref().map_or(&tree, |g| &g.drafted);
        stats.commit_ms = t.elapsed().as_secs_f64() * 1e3;
        self.sizing.after(&RoundResult {
            facts,
            nodes: drafted.len(),
            depth: drafted.max_depth() as usize,
            predicted,
            accepted: mine.as_ref().map_or(stats.accepted, |m| m.accepted.len()),
            draft_ms: stats.draft_ms,
            ms: stats.draft_ms + stats.tree_ms + stats.verify_ms + stats.commit_ms,
            batch_forward: o.batch_forward,
            eos: self
                .sizing
                .reads_eos()
                .then(|| drafted.stop_depth(|t| self.emitter.is_stop(t)))
                .flatten(),
        });
        self.rounds.push(stats);
        Ok(())
    }

    /// Whether a round's rows may come approximate (the 4-bit screen's) with each draw
    /// re-scoring its candidates exactly: unprocessed sampling under the coupled rule by a
    /// [`Sampler::rescores`] sampler. The output layer then streams the screen's bytes, not
    /// the stored head's (SmolLM2's Q8_0 head: 30 MB a row, the screen 17 MB).
    pub(super) fn rescores(&self) -> bool {
        self.process.is_none() && self.rule == VerifyRule::Coupled && self.sampler.rescores()
    }

    /// Verifies a round's rows, processed (bias, penalties, a grammar: each row over its own
    /// path; full logits were asked for) on demand — verify, process the rows its walk read
    /// unprocessed, and again until it read processed rows only (each pass extends the
    /// accepted path) — and each committed token's log-probabilities (when asked for), from
    /// the row that predicted it.
    fn verify_processed(
        &mut self,
        tree: &DraftTree,
        o: &RoundOutput,
        base: usize,
    ) -> Result<(Outcome, Vec<Option<TokenLogprob>>)> {
        let v = o.vocab;
        let raw = o.logits.get(..(tree.len() + 1) * v);
        if let Some(p) = &mut self.process {
            let raw = raw.ok_or_else(|| {
                Error::BadRequest("a processed round's forward gave no full logits".into())
            })?;
            p.begin_round(tree, raw, v, o.exact);
        }
        let outcome = loop {
            let process = self.process.as_ref();
            let row = |r: usize| match process {
                Some(p) => p.row(o.logits, r, v),
                None => o.logits_row(r),
            };
            let argmax = process.map_or(o.argmax, Processor::argmax);
            let rescore = self.rescores().then_some(o.exact);
            let out = verify(self.rule, tree, argmax, row, &self.sampler, base, rescore);
            let (Some(p), Some(raw)) = (&mut self.process, raw) else {
                break out;
            };
            let missing = p.missing(&out.accepted);
            if missing.is_empty() {
                break out;
            }
            for r in missing {
                p.process_row(tree, r, raw, v, o.exact);
            }
        };
        let logprobs = match &self.process {
            Some(p) => std::iter::once(0)
                .chain(outcome.accepted.iter().map(|&n| row_of(Some(n))))
                .zip(outcome.committed())
                .map(|(r, t)| p.logprob(p.row(o.logits, r, v), t))
                .collect(),
            None => vec![None; outcome.tokens.len() + 1],
        };
        Ok((outcome, logprobs))
    }

    /// Keeps the root's slot and the accepted path's in the cache, contiguously, and commits
    /// the accepted tokens and the bonus (streaming text, checking stops).
    fn accept(
        &mut self,
        kv: &mut KvCache,
        base: usize,
        outcome: &Outcome,
        logprobs: Vec<Option<TokenLogprob>>,
        on_text: &mut impl FnMut(&str),
    ) -> Result<()> {
        let slots: Vec<SlotId> = outcome
            .accepted
            .iter()
            .map(|&n: &NodeId| SlotId((base + row_of(Some(n))) as u32))
            .collect();
        kv.compact(base + 1, &slots)?;
        for (tok, lp) in outcome.committed().zip(logprobs) {
            self.push(tok, lp, on_text)?;
        }
        self.root = outcome.bonus;
        Ok(())
    }

    /// Commits one token with its log-probabilities (when asked for): the context the
    /// penalties read, the stream and its stops.
    fn push(
        &mut self,
        tok: TokenId,
        lp: Option<TokenLogprob>,
        on_text: &mut impl FnMut(&str),
    ) -> Result<()> {
        self.committed.push(tok);
        if let Some(p) = &mut self.process {
            p.push(tok);
        }
        if self.stop.is_none() {
            let before = self.emitter.len();
            self.stop = self.emitter.push(tok, on_text)?;
            if self.emitter.len() > before {
                self.logprobs.extend(lp);
            }
        }
        Ok(())
    }

    /// The log-probabilities of the output tokens so far (when the request asked for them).
    pub fn logprobs(&self) -> &[TokenLogprob] {
        &self.logprobs
    }

    /// The tapped states of the rows now committed: the root (row 0) and the accepted nodes.
    fn gather_hidden(&mut self, o: &RoundOutput, outcome: &Outcome) {
        let w = self.width;
        self.hidden.clear();
        for r in std::iter::once(0).chain(outcome.accepted.iter().map(|&n| row_of(Some(n)))) {
            self.hidden.extend_from_slice(&o.hidden[r * w..(r + 1) * w]);
        }
    }

    /// Every committed round's telemetry so far.
    pub fn rounds(&self) -> &[RoundStats] {
        &self.rounds
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
                logprobs: self.logprobs,
            },
            rounds,
            tau,
        }
    }
}
