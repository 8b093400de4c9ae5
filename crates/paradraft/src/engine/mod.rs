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
pub mod prefix;
mod request;
mod scheduler;

use request::Command;
pub use request::{EngineConfig, Event, Finished, Rejected, Request};

use crate::drafters::speculative_config::DrafterConfig;
use crate::error::{Error, Result};
use crate::model::Loaded;
use metrics::Metrics;
use pool::KvPool;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

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
        if !(cfg.conservativeness >= 0.0 && cfg.conservativeness.is_finite()) {
            return Err(Error::BadRequest(format!(
                "the schedule conservativeness must be a number ≥ 0, got {}",
                cfg.conservativeness
            )));
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
                    let mut s = scheduler::Scheduler {
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
        self.tx
            .send(Command::Run(Box::new(r), Instant::now()))
            .map_err(|_| {
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
