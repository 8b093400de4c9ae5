//! A small fork-join pool for the forward pass: the calling thread takes part, workers spin
//! briefly between jobs and then park, so a forward with hundreds of parallel regions pays
//! neither thread wake-ups nor a scheduler round trip per region, and an idle engine (or one
//! sharing the machine with a build) does not burn cores.
//!
//! Protocol: `state` packs (epoch << 32 | next task). A job is published in three steps: close
//! the old epoch (bump it with a task index no job reaches), store the closure pointer and task
//! count, then open a new epoch at task 0. A worker claims task i of epoch e only by a CAS from
//! (e, i) to (e, i + 1); a successful CAS proves the state did not change since the worker read
//! the job pointer and count, so both belong to epoch e, and the job cannot end before the
//! claimed task reports done, so the pointer is live while the task runs. Without the closing
//! step a worker leaving job k could read job k + 1's larger count while the state still said
//! (k, n_k) and claim a task twice (or of a closure already gone): the cause of an intermittent
//! SIGSEGV in the test suite.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// Task index of a closed epoch (between jobs): never below a job's task count.
const CLOSED: u64 = 0xFFFF_FFFF;

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(200);

type Job<'a> = &'a (dyn Fn(usize) + Sync);

struct Shared {
    state: AtomicU64,
    n_tasks: AtomicUsize,
    /// Points at a `Job` on the publishing thread's stack.
    job: AtomicPtr<()>,
    done: AtomicUsize,
    sleeping: AtomicUsize,
    /// A task of the current job panicked.
    panicked: AtomicBool,
}

pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<Thread>,
}

fn epoch(st: u64) -> u64 {
    st >> 32
}

impl Shared {
    /// Runs tasks of epoch `e` until none is left. Returns the number run.
    fn work(&self, e: u64) -> usize {
        let mut ran = 0;
        loop {
            let st = self.state.load(Acquire);
            if epoch(st) != e {
                return ran;
            }
            let i = (st & 0xFFFF_FFFF) as usize;
            let n = self.n_tasks.load(Acquire);
            if i >= n {
                return ran;
            }
            let job = self.job.load(Acquire) as *const Job;
            if self
                .state
                .compare_exchange_weak(st, st + 1, AcqRel, Relaxed)
                .is_ok()
            {
                // SAFETY: the CAS succeeded in epoch `e`, so `job` and `n` belong to this epoch,
                // and the publisher waits for this task's `done` before the job goes away. A
                // panicking task still counts as done (and is reported by `run`), so the job
                // never goes away under a running task.
                let ok =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (*job)(i) }));
                if ok.is_err() {
                    self.panicked.store(true, Release);
                }
                self.done.fetch_add(1, Release);
                ran += 1;
            }
        }
    }
}

fn worker_loop(shared: Arc<Shared>) {
    let mut seen = 0u64;
    loop {
        let t0 = Instant::now();
        let mut spins = 0u32;
        let e = loop {
            let e = epoch(shared.state.load(Acquire));
            if e != seen {
                break e;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) && t0.elapsed() > SPIN {
                shared.sleeping.fetch_add(1, SeqCst);
                if epoch(shared.state.load(SeqCst)) == seen {
                    thread::park();
                }
                shared.sleeping.fetch_sub(1, SeqCst);
            } else {
                std::hint::spin_loop();
            }
        };
        seen = e;
        shared.work(e);
    }
}

impl Pool {
    /// A pool of `threads` threads in all: the caller plus `threads - 1` workers.
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            n_tasks: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
        });
        let workers = (1..threads.max(1))
            .map(|i| {
                let s = shared.clone();
                thread::Builder::new()
                    .name(format!("paradraft-worker-{i}"))
                    .spawn(move || worker_loop(s))
                    .expect("spawn worker thread")
                    .thread()
                    .clone()
            })
            .collect();
        Pool { shared, workers }
    }

    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(0..n)` across the pool and returns when all calls have finished. Calls from
    /// several threads at once are serialised by the caller (the engine runs one forward at a
    /// time per pool).
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        if self.workers.is_empty() || n == 1 {
            (0..n).for_each(f);
            return;
        }
        let s = &*self.shared;
        let job: Job = f;
        // Close the previous epoch first (no task index is claimable in epoch e − 1): a worker
        // still leaving the previous job may already read the new task count and job pointer,
        // but its claim, a CAS on the old state, can then no longer succeed.
        let e = epoch(s.state.load(Acquire)) + 2;
        s.state.store(((e - 1) << 32) | CLOSED, SeqCst);
        s.job.store(&job as *const Job as *mut (), Release);
        s.n_tasks.store(n, Release);
        s.done.store(0, Release);
        s.panicked.store(false, Release);
        s.state.store(e << 32, SeqCst);
        if s.sleeping.load(SeqCst) > 0 {
            for w in &self.workers {
                w.unpark();
            }
        }
        s.work(e);
        while s.done.load(Acquire) < n {
            std::hint::spin_loop();
        }
        if s.panicked.load(Acquire) {
            panic!("a parallel task panicked");
        }
    }
}

/// The global pool and its size (read without taking the lock).
static POOL: OnceLock<(usize, std::sync::Mutex<Pool>)> = OnceLock::new();
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// Sets the pool size; effective only before the first parallel call.
pub fn init(threads: usize) {
    THREADS.store(threads.max(1), SeqCst);
}

fn pool() -> &'static (usize, std::sync::Mutex<Pool>) {
    POOL.get_or_init(|| {
        let n = match THREADS.load(SeqCst) {
            0 => super::default_threads(),
            n => n,
        };
        (n, std::sync::Mutex::new(Pool::new(n)))
    })
}

/// Runs `f(i)` for `i in 0..n` on the global pool. A one-thread pool runs the calls on the
/// caller without taking the pool's lock, so callers on several threads (tests, one model per
/// thread) do not queue behind each other.
pub fn run(n: usize, f: impl Fn(usize) + Sync) {
    let (threads, p) = pool();
    if *threads == 1 {
        (0..n).for_each(f);
        return;
    }
    let p = p.lock().unwrap_or_else(|e| e.into_inner());
    p.run(n, &f);
}

pub fn threads() -> usize {
    pool().0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once() {
        let p = Pool::new(3);
        for n in [1, 2, 7, 100] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..50 {
                p.run(n, &|i| {
                    hits[i].fetch_add(1, Relaxed);
                });
            }
            assert!(hits.iter().all(|h| h.load(Relaxed) == 50));
        }
    }

    #[test]
    fn a_panicking_task_is_reported_after_all_tasks_finish() {
        let p = Pool::new(2);
        let finished = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            p.run(16, &|i| {
                if i == 3 {
                    panic!("task 3");
                }
                std::thread::sleep(Duration::from_micros(200));
                finished.fetch_add(1, Relaxed);
            })
        }));
        assert!(r.is_err());
        assert_eq!(
            finished.load(Relaxed),
            15,
            "the other tasks ran to completion first"
        );
        // The pool still works afterwards.
        let sum = AtomicUsize::new(0);
        p.run(8, &|i| {
            sum.fetch_add(i, Relaxed);
        });
        assert_eq!(sum.load(Relaxed), 28);
    }

    #[test]
    fn back_to_back_jobs_of_different_sizes_run_each_task_exactly_once() {
        // A worker still leaving job k must not claim tasks of job k + 1 (or of a job whose
        // closure is gone) while job k + 1 is being published.
        let p = Pool::new(3);
        for round in 0..400_000usize {
            let n = if round % 2 == 0 { 2 } else { 9 };
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            p.run(n, &|i| {
                hits[i].fetch_add(1, Relaxed);
            });
            for (i, h) in hits.iter().enumerate() {
                assert_eq!(h.load(Relaxed), 1, "round {round}: task {i} of {n}");
            }
        }
    }

    #[test]
    fn workers_wake_after_parking() {
        let p = Pool::new(2);
        std::thread::sleep(Duration::from_millis(5));
        let sum = AtomicUsize::new(0);
        p.run(64, &|i| {
            sum.fetch_add(i, Relaxed);
        });
        assert_eq!(sum.load(Relaxed), 64 * 63 / 2);
    }
}

#[cfg(test)]
mod timing {
    #[test]
    #[ignore]
    fn region_overhead() {
        let p = super::Pool::new(2);
        let n = 100_000;
        let t = std::time::Instant::now();
        for _ in 0..n {
            p.run(8, &|_| {});
        }
        eprintln!(
            "{:.2} us per region",
            t.elapsed().as_secs_f64() * 1e6 / n as f64
        );
    }
}

/// Splits `0..n` into contiguous ranges, a few per thread, and runs them on the pool.
///
/// Ranges shrink as the work runs out (guided scheduling: each takes 1/(2·threads) of what is
/// left), so the threads finish close together: a region ends with small tasks instead of
/// one thread waiting for another's large one.
pub fn par_ranges(n: usize, f: impl Fn(usize, usize) + Sync) {
    let threads = threads();
    if threads == 1 || n <= 1 {
        return f(0, n);
    }
    let mut ends = [0usize; MAX_RANGES];
    let mut tasks = 0;
    let mut start = 0;
    while start < n {
        let left = n - start;
        let size = if tasks + 1 == MAX_RANGES {
            left
        } else {
            left.div_ceil(2 * threads)
        };
        start += size;
        ends[tasks] = start;
        tasks += 1;
    }
    run(tasks, |i| {
        let lo = if i == 0 { 0 } else { ends[i - 1] };
        f(lo, ends[i])
    });
}

/// Most ranges [`par_ranges`] makes.
const MAX_RANGES: usize = 64;

/// Rows (tokens) from which per-token work is split across threads: below it a region's
/// barrier costs more than the work. At 4 (the old value) a 4-row forward spent 9–10 % more
/// than at 16 on a 2-vCPU Xeon, and 64 was no better at 16 and 32 rows (docs/performance.md,
/// "Few-row forwards").
pub const PAR_ROWS: usize = 16;

/// A raw output pointer shared by tasks that write disjoint elements.
pub(crate) struct SendPtr<T = f32>(pub(crate) *mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
impl<T> SendPtr<T> {
    /// The pointer (a method, so that closures capture the `SendPtr`, not its field).
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: users write disjoint elements from different tasks (each call site says how).
unsafe impl<T: Send> Send for SendPtr<T> {}
unsafe impl<T: Send> Sync for SendPtr<T> {}
