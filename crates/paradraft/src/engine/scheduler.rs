//! The engine thread's scheduler: take commands → drop cancelled requests → admit while the
//! batch and the page pool have room → one [`Stepper::step`] for the batch → retire the
//! finished ones.

use super::metrics::Metrics;
use super::pool::KvPool;
use super::prefix::PrefixCache;
use super::request::{Command, EngineConfig, Event, Finished, Request};
use crate::drafters::speculative_config::{DrafterConfig, DrafterSet};
use crate::error::{Error, Result};
use crate::model::Loaded;
use crate::speculative::sizing::CostCurve;
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
    /// Pages of the pool its cache may still take over its run beyond those a cached prefix
    /// lent it (what admission set aside), and pages counted for its drafter's own cache.
    promise: usize,
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

/// The scheduler's state: the page pool, the queue, the running requests, the cached prefixes.
struct Batch<'t> {
    pool: KvPool,
    queue: Queue,
    running: Slots<'t, Meta>,
    prefixes: PrefixCache,
}

impl Batch<'_> {
    /// Pages the running requests may still take (the pool must keep them free), with their
    /// drafters' caches.
    fn promised(&self) -> usize {
        self.running
            .iter()
            .map(|r| r.meta.promise.saturating_sub(r.kv.own_pages()) + r.meta.drafter_pages)
            .sum()
    }

    /// Whether `pages` more can be promised, evicting cached prefixes (least recently used
    /// first) until they can; none is evicted when evicting them all would not make the room
    /// (their pages lent to running requests: a burst waiting for pages would otherwise
    /// destroy the prefix every waiting request shares).
    fn make_room(&mut self, pages: usize) -> bool {
        let mut available = self.pool.available(self.promised());
        if available < pages && available + self.prefixes.freeable_pages() < pages {
            return false;
        }
        while available < pages && self.prefixes.evict_lru() {
            available = self.pool.available(self.promised());
        }
        available >= pages
    }

    /// Takes new commands, blocking only when idle; `false` when the engine should stop
    /// (shut down with nothing left, or every handle gone).
    fn receive(&mut self, rx: &mpsc::Receiver<Command>) -> bool {
        if self.running.is_empty() && self.queue.waiting.is_empty() {
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
            prefixes: PrefixCache::new(self.cfg.prefix_cache_bytes),
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
            let curve = CostCurve::measure_up_to(model, 64, 2, rows)?;
            // Requests of any temperature may come.
            set.measure_costs(model, &curve, true)?;
        }
        Ok(set)
    }

    /// Pages of the target's K/V a request of `cap` tokens' drafter cache is counted as.
    fn drafter_pages(&self, set: &DrafterSet, cap: usize) -> usize {
        let c = &self.lm.model.config;
        let dtype = self.lm.model.kv_dtype();
        let target = crate::kv::bytes_per_slot(c.n_layers, c.n_kv_heads, c.head_dim, dtype);
        (cap * set.kv_bytes_per_slot()).div_ceil(super::pool::PAGE_SLOTS * target)
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
    }

    /// Admits waiting requests in arrival order while the batch and the pool have room.
    fn admit(&self, set: &DrafterSet<'e>, b: &mut Batch<'e>) {
        let model = &self.lm.model;
        while b.running.len() < self.cfg.max_running {
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
            // Its run's pages less the whole ones a cached prefix lends it, and its drafter's.
            let target = |hit: usize| KvPool::pages_for(cap) - hit / super::pool::PAGE_SLOTS;
            let drafter_pages = self.drafter_pages(set, cap);
            let expected = b.prefixes.hit_len(&r.prompt);
            if !b.make_room(target(expected) + drafter_pages) {
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
                        &model.config,
                    )
                });
            // A cached prefix of the prompt: its pages shared, its prefill skipped.
            let mut hit_tokens = 0;
            let started = started.and_then(|mut session| {
                if let Some(hit) = b.prefixes.lookup(&r.prompt, session.width()) {
                    kv.copy_from(hit.kv, hit.tokens)?;
                    session.skip_prefill(&kv, hit.tokens, hit.hidden)?;
                    hit_tokens = hit.tokens;
                }
                Ok(session)
            });
            let promise = target(hit_tokens);
            // Room was made for the hit the cache promised; a shorter one needs more.
            if started.is_ok() && hit_tokens < expected && !b.make_room(promise + drafter_pages) {
                drop((started, kv));
                b.queue.waiting.push_front((r, arrival));
                break;
            }
            if hit_tokens > 0 {
                self.metrics.prefix_hits.inc();
                self.metrics.prefix_hit_tokens.inc_by(hit_tokens as u64);
            }
            match started {
                Ok(session) => {
                    self.metrics.prompt_tokens.inc_by(r.prompt.len() as u64);
                    let meta = Meta {
                        events: r.events,
                        arrival,
                        last: None,
                        generated: 0,
                        promise,
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

    /// One forward for the whole batch (prompt chunks of at most `prefill_chunk` tokens while
    /// others decode); a failed forward fails the batch's requests, not the server.
    fn step(&self, b: &mut Batch) -> Option<StepReport> {
        let decoding = b.running.iter().any(|r| !r.session.prefilling());
        let budget = if decoding {
            self.cfg.prefill_chunk
        } else {
            self.cfg.ctx
        };
        match b.running.step(&self.lm.model, budget) {
            Ok(r) => {
                if r.rows > 0 {
                    self.metrics.step_rows.observe(r.rows as f64);
                }
                let now = Instant::now();
                // A cached prefix takes at most one page of its own (its partial last one).
                let mut spare = b.pool.available(b.promised());
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
        self.metrics.queue_depth.set(b.queue.waiting.len() as i64);
        self.metrics.running.set(b.running.len() as i64);
        let reserved: usize = b
            .running
            .iter()
            .map(|r| r.meta.promise + r.meta.drafter_pages)
            .sum();
        self.metrics.kv_pages_used.set(reserved as i64);
    }
}
