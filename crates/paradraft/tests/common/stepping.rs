//! Speculative sessions stepped together in shared forwards (`speculative::step`) until every
//! one has finished: what the batching and conformance tests drive.

use paradraft::kv::KvCache;
use paradraft::model::Model;
use paradraft::speculative::step::{Member, Stepper};
use paradraft::speculative::Session;

/// Steps `sessions` (each with its cache in `kvs`) until all finish; session i joins at step
/// `join_at(i)`, and a step prefills at most `prefill` prompt tokens in all.
pub fn step_all(
    model: &Model,
    kvs: &mut [KvCache],
    sessions: &mut [Session],
    prefill: usize,
    join_at: impl Fn(usize) -> usize,
) {
    let mut stepper = Stepper::default();
    let mut done = vec![false; sessions.len()];
    let mut steps = 0;
    while done.iter().any(|d| !d) {
        let live: Vec<usize> = (0..sessions.len())
            .filter(|&i| !done[i] && steps >= join_at(i))
            .collect();
        let mut sinks: Vec<_> = live.iter().map(|_| |_: &str| {}).collect();
        let mut members: Vec<Member> = kvs
            .iter_mut()
            .zip(sessions.iter_mut())
            .enumerate()
            .filter(|(i, _)| live.contains(i))
            .zip(sinks.iter_mut())
            .map(|((_, (kv, session)), on_text)| Member {
                kv,
                session,
                on_text,
            })
            .collect();
        let rep = stepper.step(model, &mut members, prefill).unwrap();
        assert!(rep.prefill_rows <= prefill);
        for (k, &i) in live.iter().enumerate() {
            done[i] |= rep.finished[k];
        }
        steps += 1;
        assert!(steps < 10_000, "sessions did not finish");
    }
}
