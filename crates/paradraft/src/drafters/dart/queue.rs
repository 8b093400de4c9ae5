//! Batched drafting for DART: the drafters of a batch's sessions queue their calls
//! ([`Dart::prepare`](super::Dart)) and one pass runs them all — the layer over every call's
//! rows, each over its own cache ([`DartModel::forward_many`]), and the head over every depth
//! row — so the weights are read once per step rather than once per session. (On a 2-vCPU
//! Zen 5 one pass took 0.93–1.01 of the calls apart: the committed drafter's cost is
//! arithmetic; docs/results/serving/2026-12-02-zen5-batched-drafting/.)

use super::model::{self, Call, DartModel};
use crate::drafters::parts::DraftHead;
use crate::kv::KvCache;
use crate::model::Model;
use crate::speculative::PassQueue;
use crate::types::TokenId;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One session's queued call; its cache and pending states travel with it and come back
/// with [`DartQueue::take`].
pub(super) struct Job {
    id: u64,
    pub(super) kv: KvCache,
    /// The target states of its real slots (emptied once they are in the cache).
    pub(super) features: Vec<f32>,
    pub(super) next: Vec<TokenId>,
    pub(super) masks: usize,
    /// Draft-vocabulary logits of its `masks + 1` depth rows.
    pub(super) logits: Vec<f32>,
    /// After the pass: the draft vocabulary size and this call's share of the pass's ms, or
    /// the pass's error.
    pub(super) done: Option<std::result::Result<(usize, f64), String>>,
}

/// The calls of the drafters forked from one template, waiting for their pass.
pub struct DartQueue {
    model: Arc<DartModel>,
    /// The model the drafters are bound to (the pass checks it is the one it is given).
    target: usize,
    state: Mutex<State>,
}

struct State {
    head: DraftHead,
    jobs: Vec<Job>,
    next_id: u64,
    s: model::Scratch,
    hidden: Vec<f32>,
    logits: Vec<f32>,
}

impl DartQueue {
    pub(super) fn new(model: Arc<DartModel>, head: &DraftHead, target: &Model) -> Self {
        DartQueue {
            model,
            target: target as *const Model as usize,
            state: Mutex::new(State {
                head: head.fork(),
                jobs: vec![],
                next_id: 0,
                s: model::Scratch::default(),
                hidden: vec![],
                logits: vec![],
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock holds jobs whose owners take them back or drop them.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a call; its id for [`DartQueue::take`].
    pub(super) fn push(
        &self,
        kv: KvCache,
        features: Vec<f32>,
        next: Vec<TokenId>,
        masks: usize,
        logits: Vec<f32>,
    ) -> u64 {
        let mut st = self.state();
        let id = st.next_id;
        st.next_id += 1;
        st.jobs.push(Job {
            id,
            kv,
            features,
            next,
            masks,
            logits,
            done: None,
        });
        id
    }

    /// Takes call `id` back (run or not).
    pub(super) fn take(&self, id: u64) -> Option<Job> {
        let mut st = self.state();
        let i = st.jobs.iter().position(|j| j.id == id)?;
        Some(st.jobs.swap_remove(i))
    }
}

impl PassQueue for DartQueue {
    fn run(&self, target: &Model) {
        let mut st = self.state();
        let State {
            head,
            jobs,
            s,
            hidden,
            logits,
            ..
        } = &mut *st;
        let mut todo: Vec<&mut Job> = jobs.iter_mut().filter(|j| j.done.is_none()).collect();
        if todo.is_empty() {
            return;
        }
        let t = Instant::now();
        let r = if target as *const Model as usize != self.target {
            Err("DART: batched pass given another target than its drafters'".to_string())
        } else {
            let mut calls: Vec<Call> = todo
                .iter_mut()
                .map(|j| {
                    let j = &mut **j;
                    Call {
                        kv: &mut j.kv,
                        features: &j.features,
                        next: &j.next,
                        masks: j.masks,
                    }
                })
                .collect();
            self.model
                .forward_many(target, &mut calls, s, hidden)
                .map_err(|e| e.to_string())
        };
        if let Err(e) = r {
            for j in todo {
                j.done = Some(Err(e.clone()));
            }
            return;
        }
        let v = head.logits(target, hidden, logits);
        // Each call's share of the pass is its share of the rows (a call that brings a
        // prompt's waiting states pays for them, not its neighbours).
        let rows_of = |j: &Job| (j.next.len() + j.masks) as f64;
        let per_row =
            t.elapsed().as_secs_f64() * 1e3 / todo.iter().map(|j| rows_of(j)).sum::<f64>();
        let mut row = 0;
        for j in todo {
            let share = per_row * rows_of(j);
            let rows = (j.masks + 1) * v;
            j.logits.clear();
            j.logits.extend_from_slice(&logits[row..row + rows]);
            row += rows;
            j.features.clear();
            j.done = Some(Ok((v, share)));
        }
    }
}
