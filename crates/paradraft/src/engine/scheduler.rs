//! The engine thread's scheduler: take commands → drop cancelled requests → admit while the
//! batch and the page pool have room (preempted requests first) → make room for the step's
//! rows (evicting cached prefixes, then preempting the latest arrivals) → one
//! [`Stepper::step`] for the batch → retire the finished ones.

use super::metrics::Metrics;
use super::pool::KvPool;
use super::prefix::PrefixCache;
use super::request::{Command, EngineConfig, Event, Finished, Request};
use crate::drafters::speculative_config::{DrafterConfig, DrafterSet};
use crate::error::{Error, Result};
use crate::model::Loaded;
use crate::speculative::step::{Slot, Slots, StepReport, TextSink};
use crate::speculative::Session;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Returns freed heap memory to the operating system (glibc keeps it otherwise), so an idle
/// server's memory goes back to its idle level after a burst.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A request in the batch.
type Running<'t> = Slot<'t, Meta>;

/// What the scheduler tracks of a request besides its session.
struct Meta {
    events: UnboundedSender<Event>,
    arrival: Instant,
    /// When the last token was committed (None: none yet).
    last: Option<Instant>,
    generated: usize,
    /// Its place in arrival order (admission and preemption are first come, first served).
    order: u64,
    /// Slots its cache may hold (prompt, `max_tokens`, one draft).
    cap: usize,
    /// Pages counted for its drafter's own cache (outside the pool, kept while preempted).
    drafter_pages: usize,
    /// Rounds already reported to the metrics.
    rounds: usize,
    /// Output tokens whose log-probabilities were sent.
    logprobs: usize,
    /// Its prompt's K/V went to the prefix cache (or need not).
    cached: bool,
}

impl TextSink for Meta {
    fn text(&mut self, piece: &str) {
        let _ = self.events.send(Event::Text(piece.to_string()));
    }
}

pub(super) struct Scheduler<'e> {
    pub(super) lm: &'e Loaded,
    pub(super) cfg: &'e EngineConfig,
    pub(super) metrics: &'e Metrics,
    pub(super) in_flight: &'e AtomicUsize,
}

/// The requests waiting for a place in the batch, in arrival order, and whether the engine
/// is shutting down.
#[derive(Default)]
struct Queue {
    waiting: VecDeque<(Request, Instant)>,
    shutdown: bool,
}

impl Queue {
    fn take(&mut self, cmd: Command) {
        match cmd {
            Command::Run(r, t) => self.waiting.push_back((*r, t)),
            Command::Shutdown => self.shutdown = true,
        }
    }
}

/// The scheduler's state: the page pool, the queue, the running requests, the preempted
/// ones, the cached prefixes.
struct Batch<'t> {
    pool: KvPool,
    queue: Queue,
    running: Slots<'t, Meta>,
    /// Requests preempted for pages, in arrival order: their sessions wait with empty caches.
    parked: Vec<Running<'t>>,
    prefixes: PrefixCache,
    /// Requests admitted so far (each one's `order`).
    admitted: u64,
    /// The share of the rest of its run (its `max_tokens` not yet generated) a running request
    /// is expected to take, set aside for each at admission (SGLang's new-token ratio): it
    /// starts at [`GROWTH_START`], falls over [`GROWTH_STEPS`] steps to [`GROWTH_MIN`] and
    /// rises by [`GROWTH_BUMP`] at each preemption, so admission settles near the batch the
    /// pool holds with few preemptions (each recomputes the preempted request's tokens); both
    /// scaled by `EngineConfig::conservativeness`. 1 throughout would set aside every
    /// request's whole run (no preemption), 0 only its prompt and a round.
    growth: f64,
    growth_min: f64,
    growth_decay: f64,
}

const GROWTH_START: f64 = 0.7;
const GROWTH_MIN: f64 = 0.1;
const GROWTH_STEPS: f64 = 600.0;
const GROWTH_BUMP: f64 = 0.1;

impl Batch<'_> {
    /// Pages counted for the drafters' own caches (running and preempted requests keep them).
    fn drafters(&self) -> usize {
        let pages = |r: &Running| r.meta.drafter_pages;
        self.running.iter().map(pages).sum::<usize>() + self.parked.iter().map(pages).sum::<usize>()
    }

    /// Most prompt tokens the next step prefills: a chunk while others decode, else all.
    fn prefill_budget(&self, cfg: &EngineConfig) -> usize {
        if self.running.iter().any(|r| !r.session.prefilling()) {
            cfg.prefill_chunk
        } else {
            cfg.ctx
        }
    }

    /// Pages the running requests may take from the pool: the next step's rows (prompt chunks
    /// as the stepper splits `budget`, in batch order, and each decoding request's largest
    /// round) or, when more, the rest of its prompt and `growth` of the rest of its run.
    fn step_pages(&self, budget: usize, growth: f64) -> usize {
        let mut left = budget;
        let mut pages = 0;
        for r in self.running.iter() {
            let (rows, prompt) = if r.session.prefilling() {
                let take = r.session.prompt_left().min(left);
                left -= take;
                (take, r.session.prompt_left())
            } else {
                (r.session.max_round_rows(), 0)
            };
            let rest = r.kv.capacity().saturating_sub(r.kv.len() + prompt);
            let ahead = prompt + (growth * rest as f64).ceil() as usize;
            pages += r.kv.pages_to_reserve(rows.max(ahead));
        }
        pages
    }

    /// Free pages beyond the drafters' and what the running requests may take (the next step
    /// alone with `growth` 0; negative: it does not fit).
    fn spare(&self, budget: usize, growth: f64) -> isize {
        self.pool.free() as isize - (self.drafters() + self.step_pages(budget, growth)) as isize
    }

    /// Whether `pages` more are free beyond what the running requests are expected to take
    /// ([`Batch::growth`]), evicting cached prefixes (least recently used first) until they
    /// are; none is evicted when evicting them all would not make the room (their pages lent
    /// to running requests: a burst waiting for pages would otherwise destroy the prefix every
    /// waiting request shares).
    fn make_room(&mut self, pages: usize, budget: usize) -> bool {
        let pages = pages as isize;
        let mut spare = self.spare(budget, self.growth);
        if spare < pages && spare + (self.prefixes.freeable_pages() as isize) < pages {
            return false;
        }
        while spare < pages && self.prefixes.evict_lru() {
            spare = self.spare(budget, self.growth);
        }
        spare >= pages
    }

    /// Pages a request whose cache must hold `fill` tokens before it decodes (its prompt, or a
    /// preempted one's tokens), in a cache of `cap` slots, is admitted for: those, a round of
    /// `round` rows and [`Batch::growth`] of the rest of its run.
    fn admit_pages(&self, fill: usize, round: usize, cap: usize) -> usize {
        let rest = cap.saturating_sub(fill + round);
        KvPool::pages_for((fill + round + (self.growth * rest as f64).ceil() as usize).min(cap))
    }

    /// Makes room for the next step's rows: cached prefixes are evicted first, then the
    /// running requests that arrived last are preempted (their pages go back; they wait
    /// parked, ahead of new requests, and rebuild their caches when readmitted). The first
    /// arrival is never preempted: the pool holds it alone (checked at start and admission).
    /// Returns how many were preempted.
    fn fit_step(&mut self, cfg: &EngineConfig) -> Result<usize> {
        let mut preempted = 0;
        while self.spare(self.prefill_budget(cfg), 0.0) < 0 {
            if self.prefixes.freeable_pages() > 0 && self.prefixes.evict_lru() {
                continue;
            }
            if self.running.len() < 2 {
                break;
            }
            let last = self.running.iter().map(|r| r.meta.order).max();
            let mut gone = self.running.remove_where(|r| Some(r.meta.order) == last);
            for mut r in gone.drain(..) {
                r.session.preempt(&mut r.kv)?;
                let at = self.parked.partition_point(|p| p.meta.order < r.meta.order);
                self.parked.insert(at, r);
                preempted += 1;
            }
            if self.growth_min > 0.0 {
                self.growth = (self.growth + GROWTH_BUMP).min(1.0);
            }
        }
        self.growth = (self.growth - self.growth_decay).max(self.growth_min);
        Ok(preempted)
    }

    /// Takes new commands, blocking only when idle; `false` when the engine should stop
    /// (shut down with nothing left, or every handle gone).
    fn receive(&mut self, rx: &mpsc::Receiver<Command>) -> bool {
        if self.running.is_empty() && self.parked.is_empty() && self.queue.waiting.is_empty() {
            if self.queue.shutdown {
                return false;
            }
            // Idle: give back the batch's scratch (sized for the largest step so far) and the
            // memory of the pool's free pages.
            self.running.shrink();
            self.pool.trim();
            release_free_memory();
            match rx.recv() {
                Ok(cmd) => self.queue.take(cmd),
                Err(_) => return false, // every handle is gone
            }
        }
        while let Ok(cmd) = rx.try_recv() {
            self.queue.take(cmd);
        }
        true
    }
}

impl<'e> Scheduler<'e> {
    /// The engine thread's loop: load the drafters (say so on `ready`), then until shutdown:
    /// take commands, drop cancelled requests, admit, step the batch, retire the finished.
    pub(super) fn run(
        &mut self,
        target_path: &std::path::Path,
        drafter: &DrafterConfig,
        rx: mpsc::Receiver<Command>,
        ready: mpsc::Sender<Result<()>>,
    ) {
        let loaded = self.load(target_path, drafter).and_then(|s| {
            let pool = KvPool::new(&self.lm.model, self.cfg.kv_pages)?;
            Ok((s, pool))
        });
        let (set, pool) = match loaded {
            Ok(s) => {
                let _ = ready.send(Ok(()));
                s
            }
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let mut b = Batch {
            pool,
            queue: Queue::default(),
            running: Slots::default(),
            parked: Vec::new(),
            prefixes: PrefixCache::new(self.cfg.prefix_cache_bytes),
            admitted: 0,
            growth: (GROWTH_START * self.cfg.conservativeness).min(1.0),
            growth_min: (GROWTH_MIN * self.cfg.conservativeness).min(1.0),
            growth_decay: (GROWTH_START - GROWTH_MIN) * self.cfg.conservativeness / GROWTH_STEPS,
        };
        while b.receive(&rx) {
            self.cancel(&mut b);
            self.admit(&set, &mut b);
            self.gauges(&b);
            if b.running.is_empty() {
                continue;
            }
            if let Some(report) = self.step(&mut b) {
                self.retire_finished(&report, &mut b);
            }
            self.gauges(&b);
        }
    }

    /// Weights load once; each request gets its own drafter state. Verify costs are measured
    /// up to a full batch's rows, for batch-aware draft sizing.
    fn load(
        &self,
        target_path: &std::path::Path,
        drafter: &DrafterConfig,
    ) -> Result<DrafterSet<'e>> {
        let model = &self.lm.model;
        let mut set = drafter.load(target_path, self.lm, self.cfg.ctx)?;
        let need = KvPool::pages_for(self.cfg.ctx) + self.drafter_pages(&set, self.cfg.ctx);
        if need > self.cfg.kv_pages {
            return Err(Error::BadRequest(format!(
                "a KV pool of {} pages cannot hold one request of the full context with drafter {}'s own cache ({need} pages)",
                self.cfg.kv_pages, set.label
            )));
        }
        if set.adaptive && !set.is_ar() {
            let rows = (self.cfg.max_running * (set.max_draft + 1)).clamp(32, 512);
            set.keep_costs(&crate::fetch::home_dir().join("guard"), target_path, model);
            // Requests of any temperature may come.
            set.measure_to(model, rows, true)?;
        }
        Ok(set)
    }

    /// Pages of the target's K/V a request of `cap` tokens' drafter cache (and the target
    /// states it may hold before taking them in) is counted as.
    fn drafter_pages(&self, set: &DrafterSet, cap: usize) -> usize {
        let c = &self.lm.model.config;
        let dtype = self.lm.model.kv_dtype();
        let target = crate::kv::bytes_per_slot(c.n_layers, c.n_kv_heads, c.head_dim, dtype);
        (cap * set.kv_bytes_per_slot() + set.pending_bytes(cap))
            .div_ceil(super::pool::PAGE_SLOTS * target)
    }

    /// Cancelled requests (their client went away) leave and free their pages.
    fn cancel(&self, b: &mut Batch) {
        b.queue.waiting.retain(|(r, _)| {
            let keep = !r.events.is_closed();
            if !keep {
                self.ended("cancelled");
            }
            keep
        });
        for r in b.running.remove_where(|r| r.meta.events.is_closed()) {
            drop(r); // its pages go back
            self.ended("cancelled");
        }
        let before = b.parked.len();
        b.parked.retain(|r| !r.meta.events.is_closed());
        for _ in b.parked.len()..before {
            self.ended("cancelled");
        }
    }

    /// Admits requests in arrival order while the batch and the pool have room: preempted
    /// ones first (a new request waits while an earlier one cannot resume), each when the
    /// free pages beyond what the running ones are expected to take cover its prompt (or its
    /// rebuild), one round and its own expected growth, less the whole pages a cached prefix
    /// lends it, and its drafter's cache.
    fn admit(&self, set: &DrafterSet<'e>, b: &mut Batch<'e>) {
        while b.running.len() < self.cfg.max_running {
            if !b.parked.is_empty() {
                if self.resume(b) {
                    continue;
                }
                break;
            }
            let Some((r, arrival)) = b.queue.waiting.pop_front() else {
                break;
            };
            // A prompt sharing more of its beginning with one being prefilled than the cache
            // holds waits for that prefill to finish, then copies the shared part (a burst
            // with one system prompt, `n` samples of one prompt, computes it once).
            if b.prefixes.enabled() {
                let cached = b.prefixes.hit_len(&r.prompt);
                let shared = b
                    .running
                    .iter()
                    .filter(|s| s.session.prefilling())
                    .map(|s| super::prefix::common(s.session.prompt(), &r.prompt))
                    .max()
                    .unwrap_or(0)
                    .min(r.prompt.len().saturating_sub(1));
                if shared >= super::prefix::MIN_HIT && shared > cached {
                    b.queue.waiting.push_front((r, arrival));
                    break;
                }
            }
            let cap =
                (r.prompt.len() + r.params.max_new_tokens + set.max_draft + 1).min(self.cfg.ctx);
            // Its prompt, a round and its expected growth, less the whole pages a cached prefix
            // lends it.
            let pages = b.admit_pages(r.prompt.len(), set.max_draft + 1, cap);
            let target = |hit: usize| pages.saturating_sub(hit / super::pool::PAGE_SLOTS);
            let drafter_pages = self.drafter_pages(set, cap);
            let expected = b.prefixes.hit_len(&r.prompt);
            // Drafters' caches stay while their requests are preempted: the first arrival
            // must still fit beside them all.
            let beside = b.drafters() + drafter_pages + KvPool::pages_for(self.cfg.ctx);
            let budget = b.prefill_budget(self.cfg);
            if beside > b.pool.total() || !b.make_room(target(expected) + drafter_pages, budget) {
                b.queue.waiting.push_front((r, arrival));
                break;
            }
            let mut kv = b.pool.cache(cap);
            let started = set
                .speculation_within(r.params.sampling, self.cfg.rule, cap)
                .and_then(|mut sp| {
                    if let Some(n) = r.max_draft {
                        sp.max_draft = sp.max_draft.min(n);
                    }
                    Session::new(
                        &self.lm.tokenizer,
                        &mut kv,
                        &r.prompt,
                        &r.params,
                        sp,
                        &self.lm.model.config,
                    )
                });
            // A cached prefix of the prompt: its pages shared, its prefill skipped.
            let mut hit_tokens = 0;
            let started = started.and_then(|mut session| {
                hit_tokens = self.reuse_prefix(b, &mut kv, &mut session)?;
                Ok(session)
            });
            // Room was made for the hit the cache promised; a shorter one needs more.
            if started.is_ok()
                && hit_tokens < expected
                && !b.make_room(target(hit_tokens) + drafter_pages, budget)
            {
                drop((started, kv));
                b.queue.waiting.push_front((r, arrival));
                break;
            }
            match started {
                Ok(session) => {
                    self.metrics.prompt_tokens.inc_by(r.prompt.len() as u64);
                    b.admitted += 1;
                    let meta = Meta {
                        events: r.events,
                        arrival,
                        last: None,
                        generated: 0,
                        order: b.admitted,
                        cap,
                        drafter_pages,
                        rounds: 0,
                        logprobs: 0,
                        cached: false,
                    };
                    b.running.push(kv, session, meta);
                }
                Err(e) => {
                    self.ended("error");
                    let _ = r.events.send(Event::Error(e.to_string()));
                }
            }
        }
    }

    /// Starts `session` from the longest cached prefix of the tokens its cache must hold
    /// (its prompt, or after a preemption its committed tokens): the prefix's pages shared,
    /// their prefill skipped. Returns the tokens reused.
    fn reuse_prefix(
        &self,
        b: &mut Batch,
        kv: &mut crate::kv::KvCache,
        session: &mut Session,
    ) -> Result<usize> {
        let fill = session.to_fill().to_vec();
        let Some(hit) = b.prefixes.lookup(&fill, session.width()) else {
            return Ok(0);
        };
        kv.copy_from(hit.kv, hit.tokens)?;
        session.skip_prefill(kv, hit.tokens, hit.hidden)?;
        self.metrics.prefix_hits.inc();
        self.metrics.prefix_hit_tokens.inc_by(hit.tokens as u64);
        Ok(hit.tokens)
    }

    /// Readmits the preempted request that arrived first when the pool has room for its
    /// cache's rebuild and a round (a cached prefix of its tokens is shared, not recomputed);
    /// `false` when it must wait.
    fn resume(&self, b: &mut Batch<'e>) -> bool {
        let r = &b.parked[0];
        let fill = r.session.to_fill();
        let need = b
            .admit_pages(fill.len(), r.session.max_round_rows(), r.meta.cap)
            .saturating_sub(b.prefixes.hit_len(fill) / super::pool::PAGE_SLOTS);
        if !b.make_room(need, b.prefill_budget(self.cfg)) {
            return false;
        }
        let mut r = b.parked.remove(0);
        match self.reuse_prefix(b, &mut r.kv, &mut r.session) {
            Ok(_) => b.running.push(r.kv, r.session, r.meta),
            Err(e) => {
                self.ended("error");
                let _ = r.meta.events.send(Event::Error(e.to_string()));
            }
        }
        true
    }

    /// One forward for the whole batch (prompt chunks of at most `prefill_chunk` tokens while
    /// others decode); a failed forward fails the batch's requests, not the server.
    fn step(&self, b: &mut Batch) -> Option<StepReport> {
        let stepped = b.fit_step(self.cfg).and_then(|preempted| {
            self.metrics.preemptions.inc_by(preempted as u64);
            let budget = b.prefill_budget(self.cfg);
            b.running.step(&self.lm.model, budget)
        });
        match stepped {
            Ok(r) => {
                if r.rows > 0 {
                    self.metrics.step_rows.observe(r.rows as f64);
                }
                for (phase, ms) in [
                    ("plan", r.plan_ms),
                    ("draft_pass", r.pass_ms),
                    ("forward", r.forward_ms),
                    ("commit", r.commit_ms),
                ] {
                    self.metrics
                        .step_seconds
                        .with_label_values(&[phase])
                        .inc_by(ms.max(0.0) / 1e3);
                }
                let now = Instant::now();
                // A cached prefix takes at most one page of its own (its partial last one).
                let mut spare = b.pool.free().saturating_sub(b.drafters());
                for run in b.running.iter_mut() {
                    self.observe(run, now);
                    // A prompt just prefilled: its K/V and states for later requests.
                    if !run.meta.cached && !run.session.prefilling() {
                        run.meta.cached = true;
                        if let (Some(h), true) = (run.session.prompt_states(), spare > 0) {
                            spare -= 1;
                            b.prefixes.insert(run.session.prompt(), &run.kv, h);
                        }
                    }
                }
                self.metrics
                    .prefix_evictions
                    .inc_by(b.prefixes.evictions - self.metrics.prefix_evictions.get());
                self.metrics.prefix_bytes.set(b.prefixes.bytes() as i64);
                Some(r)
            }
            Err(e) => {
                for r in b.running.drain() {
                    self.ended("error");
                    let _ = r.meta.events.send(Event::Error(e.to_string()));
                }
                None
            }
        }
    }

    /// Retires the requests the step finished (its members are in `running`'s order). The
    /// gauges are updated before any client hears that its request ended, so what it reads
    /// next in /metrics no longer counts it.
    fn retire_finished(&self, report: &StepReport, b: &mut Batch) {
        let mut done = b.running.take_finished(report);
        for r in &mut done {
            r.kv.clear(); // its pages go back
        }
        // Prefixes it shared are now the cache's alone, counted in its budget.
        b.prefixes.fit();
        self.gauges(b);
        for r in done {
            self.retire(r);
        }
    }

    /// Sends a finished request its last text and summary.
    fn retire(&self, r: Running) {
        let Slot {
            session, mut meta, ..
        } = r;
        let g = session.finish(&mut |piece: &str| meta.text(piece));
        let tx = &meta.events;
        self.metrics
            .e2e
            .observe(meta.arrival.elapsed().as_secs_f64());
        // Counted before the client hears it, so what it reads next in /metrics includes it.
        self.ended("finished");
        let _ = tx.send(Event::Done(Finished {
            prompt_tokens: g.out.stats.prompt_tokens,
            completion_tokens: g.out.token_ids.len(),
            stop_reason: g.out.stop_reason,
            token_ids: g.out.token_ids,
            tau: g.tau,
            rounds: g.rounds.len(),
            drafted: g.rounds.iter().map(|r| r.drafted).sum(),
            accepted: g.rounds.iter().map(|r| r.accepted).sum(),
        }));
    }

    /// Token timing of one request after a step.
    fn observe(&self, r: &mut Running, now: Instant) {
        let g = r.session.generated();
        let new = g.saturating_sub(r.meta.generated);
        if new > 0 {
            match r.meta.last {
                None => {
                    self.metrics
                        .ttft
                        .observe((now - r.meta.arrival).as_secs_f64());
                    if new > 1 {
                        self.metrics.itl.observe(0.0);
                    }
                }
                Some(t) => {
                    let per = (now - t).as_secs_f64() / new as f64;
                    for _ in 0..new {
                        self.metrics.itl.observe(per);
                    }
                }
            }
            r.meta.last = Some(now);
            r.meta.generated = g;
            self.metrics.generation_tokens.inc_by(new as u64);
        }
        let rounds = r.session.rounds();
        for round in &rounds[r.meta.rounds..] {
            if round.drafted > 0 {
                self.metrics
                    .accepted
                    .with_label_values(&[r.session.drafter_name()])
                    .observe(round.accepted as f64);
            }
            if let Some(why) = round.undrafted {
                self.metrics
                    .undrafted
                    .with_label_values(&[r.session.drafter_name(), why.name()])
                    .inc();
            }
        }
        r.meta.rounds = rounds.len();
        let lps = r.session.logprobs();
        if lps.len() > r.meta.logprobs {
            let new = lps[r.meta.logprobs..].to_vec();
            r.meta.logprobs = lps.len();
            let _ = r.meta.events.send(Event::Logprobs(new));
        }
    }

    fn ended(&self, outcome: &str) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.metrics.requests.with_label_values(&[outcome]).inc();
    }

    fn gauges(&self, b: &Batch) {
        self.metrics.running.set(b.running.len() as i64);
        self.metrics
            .queue_depth
            .set((b.queue.waiting.len() + b.parked.len()) as i64);
        self.metrics.preempted.set(b.parked.len() as i64);
        let held: usize = b.running.iter().map(|r| r.kv.own_pages()).sum();
        self.metrics.kv_pages_used.set((held + b.drafters()) as i64);
    }
}
