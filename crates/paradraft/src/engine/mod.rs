//! The serving engine: one thread owns the model and runs a continuous-batching scheduler
//! (TGI's router shape: requests are validated by the caller, queued here, and one task
//! batches them).
//!
//! Each step the scheduler retires cancelled requests, admits waiting ones while the batch and
//! the KV page pool have room ([`pool`]), and runs one [`Stepper::step`]: prompt chunks (at
//! most `prefill_chunk` tokens per step while others decode, so a long prompt does not stall
//! them) and every running request's speculative round in ONE forward. Committed text streams
//! to each request's channel as soon as it is final.

pub mod metrics;
pub mod pool;

use crate::drafters::speculative_config::DrafterConfig;
use crate::error::{Error, Result};
use crate::generate::{GenerateParams, StopReason};
use crate::kv::KvCache;
use crate::model::Loaded;
use crate::speculative::sizing::CostCurve;
use crate::speculative::step::{Member, Stepper};
use crate::speculative::{Session, VerifyRule};
use crate::types::TokenId;
use metrics::Metrics;
use pool::KvPool;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// How the engine batches and what it admits.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Tokens a request may hold (prompt and output).
    pub ctx: usize,
    /// Most requests in the running batch.
    pub max_running: usize,
    /// Most requests waiting for admission; beyond it `submit` refuses (HTTP 429).
    pub max_queue: usize,
    /// KV pool size in pages of 16 slots.
    pub kv_pages: usize,
    /// Most prompt tokens per step while other requests decode.
    pub prefill_chunk: usize,
    pub rule: VerifyRule,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            ctx: 2048,
            max_running: 64,
            max_queue: 256,
            kv_pages: 64 * 2048 / pool::PAGE_SLOTS,
            prefill_chunk: 256,
            rule: VerifyRule::Coupled,
        }
    }
}

/// A validated generation request.
pub struct Request {
    pub prompt: Vec<TokenId>,
    pub params: GenerateParams,
    /// Where the request's text and result go; dropping the receiver cancels the request.
    pub events: UnboundedSender<Event>,
}

/// What a request hears from the engine: text pieces as they become final, then one
/// `Done` or `Error`.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Text(String),
    Done(Finished),
    Error(String),
}

/// A finished request's summary.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub stop_reason: StopReason,
    pub token_ids: Vec<TokenId>,
    /// Tokens per target pass (0 without rounds).
    pub tau: f64,
}

/// Why a request was not queued.
#[derive(Debug, thiserror::Error)]
pub enum Rejected {
    #[error("the server is at capacity ({0} requests running or queued); retry later")]
    Busy(usize),
    #[error("the engine has stopped")]
    Stopped,
}

enum Command {
    Run(Request, Instant),
    Shutdown,
}

/// A handle on the engine thread.
pub struct Engine {
    tx: mpsc::Sender<Command>,
    thread: Option<std::thread::JoinHandle<()>>,
    lm: Arc<Loaded>,
    metrics: Arc<Metrics>,
    /// Requests queued or running.
    in_flight: Arc<AtomicUsize>,
    cfg: EngineConfig,
    drafter: String,
}

impl Engine {
    /// Starts the engine thread with `drafter` loaded for the target `lm` (read from
    /// `target_path`, which a self-speculative drafter re-reads); returns once the drafter is
    /// loaded and its costs measured.
    pub fn start(
        lm: Arc<Loaded>,
        target_path: PathBuf,
        drafter: DrafterConfig,
        cfg: EngineConfig,
    ) -> Result<Engine> {
        if cfg.max_running == 0 || cfg.prefill_chunk == 0 || cfg.ctx < 2 {
            return Err(Error::BadRequest(
                "max_running, prefill_chunk must be ≥ 1 and the context ≥ 2".into(),
            ));
        }
        let need = KvPool::pages_for(cfg.ctx);
        if cfg.kv_pages < need {
            return Err(Error::BadRequest(format!(
                "a KV pool of {} pages cannot hold one request of the full context ({need} pages)",
                cfg.kv_pages
            )));
        }
        let metrics = Arc::new(Metrics::new());
        let in_flight = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let label = drafter.label();
        let thread = {
            let (lm, metrics, in_flight, cfg) =
                (lm.clone(), metrics.clone(), in_flight.clone(), cfg.clone());
            std::thread::Builder::new()
                .name("paradraft-engine".into())
                .spawn(move || {
                    let mut s = Scheduler {
                        lm: &lm,
                        cfg: &cfg,
                        metrics: &metrics,
                        in_flight: &in_flight,
                    };
                    s.run(&target_path, &drafter, rx, ready_tx);
                })
                .map_err(|e| Error::io("engine thread", e))?
        };
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(Error::BadRequest(
                    "the engine thread failed to start".into(),
                ));
            }
        }
        metrics.kv_pages_total.set(cfg.kv_pages as i64);
        Ok(Engine {
            tx,
            thread: Some(thread),
            lm,
            metrics,
            in_flight,
            cfg,
            drafter: label,
        })
    }

    /// Queues a request, or refuses it when `max_running + max_queue` requests are in flight.
    pub fn submit(&self, r: Request) -> std::result::Result<(), Rejected> {
        let cap = self.cfg.max_running + self.cfg.max_queue;
        let n = self.in_flight.fetch_add(1, Ordering::SeqCst);
        if n >= cap {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.metrics.requests.with_label_values(&["rejected"]).inc();
            return Err(Rejected::Busy(n));
        }
        self.tx.send(Command::Run(r, Instant::now())).map_err(|_| {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            Rejected::Stopped
        })
    }

    /// The model and tokenizer the engine serves.
    pub fn loaded(&self) -> &Loaded {
        &self.lm
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The drafter's name in reports.
    pub fn drafter(&self) -> &str {
        &self.drafter
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Requests queued or running.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Stops the engine thread once the requests in flight have ended (dropped receivers
    /// cancel theirs).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.tx.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}

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
struct Running<'t> {
    kv: KvCache,
    session: Session<'t>,
    meta: Meta,
}

/// What the scheduler tracks of a request besides its session.
struct Meta {
    events: UnboundedSender<Event>,
    arrival: Instant,
    /// When the last token was committed (None: none yet).
    last: Option<Instant>,
    generated: usize,
    pages: usize,
    /// Rounds already reported to the metrics.
    rounds: usize,
}

struct Scheduler<'e> {
    lm: &'e Loaded,
    cfg: &'e EngineConfig,
    metrics: &'e Metrics,
    in_flight: &'e AtomicUsize,
}

impl<'e> Scheduler<'e> {
    fn run(
        &mut self,
        target_path: &std::path::Path,
        drafter: &DrafterConfig,
        rx: mpsc::Receiver<Command>,
        ready: mpsc::Sender<Result<()>>,
    ) {
        let model = &self.lm.model;
        // Weights load once; each request gets its own drafter state. Verify costs are
        // measured up to a full batch's rows, for batch-aware draft sizing.
        let set = drafter
            .load(target_path, self.lm, self.cfg.ctx)
            .and_then(|mut set| {
                if set.adaptive && !set.is_ar() {
                    let rows = (self.cfg.max_running * (set.max_draft + 1)).clamp(32, 512);
                    let curve = CostCurve::measure_up_to(model, 64, 2, rows)?;
                    set.measure_costs(model, &curve)?;
                }
                Ok(set)
            });
        let set = match set {
            Ok(s) => {
                let _ = ready.send(Ok(()));
                s
            }
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let mut pool = KvPool::new(self.cfg.kv_pages);
        let mut waiting: VecDeque<(Request, Instant)> = VecDeque::new();
        let mut running: Vec<Running> = Vec::new();
        let mut stepper = Stepper::default();
        let mut shutdown = false;
        loop {
            // Take new commands; block only when idle.
            if running.is_empty() && waiting.is_empty() {
                if shutdown {
                    return;
                }
                // Idle: give back the batch's scratch (sized for the largest step so far).
                stepper = Stepper::default();
                release_free_memory();
                match rx.recv() {
                    Ok(Command::Run(r, t)) => waiting.push_back((r, t)),
                    Ok(Command::Shutdown) => shutdown = true,
                    Err(_) => return, // every handle is gone
                }
            }
            while let Ok(cmd) = rx.try_recv() {
                match cmd {
                    Command::Run(r, t) => waiting.push_back((r, t)),
                    Command::Shutdown => shutdown = true,
                }
            }
            // Cancelled requests leave and free their pages.
            waiting.retain(|(r, _)| {
                let keep = !r.events.is_closed();
                if !keep {
                    self.ended("cancelled");
                }
                keep
            });
            let mut i = 0;
            while i < running.len() {
                if running[i].meta.events.is_closed() {
                    let r = running.swap_remove(i);
                    pool.release(r.meta.pages);
                    self.ended("cancelled");
                } else {
                    i += 1;
                }
            }
            // Admit in arrival order while the batch and the pool have room.
            while running.len() < self.cfg.max_running {
                let Some((r, arrival)) = waiting.front() else {
                    break;
                };
                let cap = (r.prompt.len() + r.params.max_new_tokens + set.max_draft + 1)
                    .min(self.cfg.ctx);
                let pages = KvPool::pages_for(cap);
                if !pool.try_reserve(pages) {
                    break;
                }
                let arrival = *arrival;
                let (r, _) = waiting.pop_front().expect("a front");
                let mut kv = model.new_kv(cap);
                let started = set
                    .speculation(r.params.sampling, self.cfg.rule)
                    .and_then(|sp| {
                        Session::new(
                            &self.lm.tokenizer,
                            &mut kv,
                            &r.prompt,
                            &r.params,
                            sp,
                            model.config.hidden_size,
                        )
                    });
                match started {
                    Ok(session) => {
                        self.metrics.prompt_tokens.inc_by(r.prompt.len() as u64);
                        running.push(Running {
                            kv,
                            session,
                            meta: Meta {
                                events: r.events,
                                arrival,
                                last: None,
                                generated: 0,
                                pages,
                                rounds: 0,
                            },
                        });
                    }
                    Err(e) => {
                        pool.release(pages);
                        self.ended("error");
                        let _ = r.events.send(Event::Error(e.to_string()));
                    }
                }
            }
            self.gauges(&waiting, &running, &pool);
            if running.is_empty() {
                continue;
            }
            // One forward for the whole batch.
            let decoding = running.iter().any(|r| !r.session.prefilling());
            let budget = if decoding {
                self.cfg.prefill_chunk
            } else {
                self.cfg.ctx
            };
            let report = {
                let mut sinks = Vec::with_capacity(running.len());
                let mut parts = Vec::with_capacity(running.len());
                for r in running.iter_mut() {
                    let Running { kv, session, meta } = r;
                    let tx = &meta.events;
                    sinks.push(move |piece: &str| {
                        let _ = tx.send(Event::Text(piece.to_string()));
                    });
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
                stepper.step(model, &mut members, budget)
            };
            let report = match report {
                Ok(r) => r,
                Err(e) => {
                    // A failed forward fails the batch's requests, not the server.
                    for r in running.drain(..) {
                        pool.release(r.meta.pages);
                        self.ended("error");
                        let _ = r.meta.events.send(Event::Error(e.to_string()));
                    }
                    continue;
                }
            };
            if report.rows > 0 {
                self.metrics.step_rows.observe(report.rows as f64);
            }
            let now = Instant::now();
            for r in running.iter_mut() {
                self.observe(r, now);
            }
            // Retire finished requests (members are in `running`'s order).
            for i in (0..running.len()).rev() {
                if report.finished.get(i).copied().unwrap_or(false) {
                    let r = running.swap_remove(i);
                    pool.release(r.meta.pages);
                    self.retire(r);
                }
            }
            self.gauges(&waiting, &running, &pool);
        }
    }

    /// Sends a finished request its last text and summary.
    fn retire(&self, r: Running) {
        let Running { session, meta, .. } = r;
        let tx = &meta.events;
        let g = session.finish(&mut |piece: &str| {
            let _ = tx.send(Event::Text(piece.to_string()));
        });
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
        }
        r.meta.rounds = rounds.len();
    }

    fn ended(&self, outcome: &str) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.metrics.requests.with_label_values(&[outcome]).inc();
    }

    fn gauges(&self, waiting: &VecDeque<(Request, Instant)>, running: &[Running], pool: &KvPool) {
        self.metrics.queue_depth.set(waiting.len() as i64);
        self.metrics.running.set(running.len() as i64);
        self.metrics.kv_pages_used.set(pool.used() as i64);
    }
}
