//! The target's verify-cost curve c(rows) and a drafter's proposal-cost curve, measured on
//! this machine.

use crate::error::Result;
use crate::kv::KvCache;
use crate::model::{Batch, Logits, Model, OutputSpec, Rows, Scratch};
use crate::speculative::{Drafter, Hidden};
use crate::types::{Pos, TokenId};
use std::time::Instant;

/// Verify cost in ms of a forward over `rows` rows, interpolated from measured points.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CostCurve {
    /// (rows, ms), increasing in rows.
    pub points: Vec<(usize, f64)>,
}

impl CostCurve {
    /// Times forwards of 1, 2, 4, 8, 16, 32 rows (min of `repeats`, the sizes interleaved)
    /// after `context` cached tokens and [`WARM_FORWARDS`] untimed one-row forwards. Costs a few
    /// hundred ms on a small model.
    pub fn measure(model: &Model, context: usize, repeats: usize) -> Result<CostCurve> {
        Self::measure_up_to(model, context, repeats, 32)
    }

    /// [`CostCurve::measure`] with forwards of 1, 2, 4, … up to `max_rows` rows (a batch's
    /// verify forwards are wider than one request's).
    pub fn measure_up_to(
        model: &Model,
        context: usize,
        repeats: usize,
        max_rows: usize,
    ) -> Result<CostCurve> {
        Self::measure_rows(model, context, repeats, max_rows, None)
    }

    /// [`CostCurve::measure_up_to`] for verifying sampled drafts: every row's logits (the
    /// screen's where the sampler re-scores, else exact) and a draw from each, as a round at
    /// T > 0 does.
    pub fn measure_sampled(
        model: &Model,
        context: usize,
        repeats: usize,
        max_rows: usize,
        sampling: crate::sample::SamplingParams,
    ) -> Result<CostCurve> {
        let sampler = crate::sample::Sampler::new(sampling)?;
        Self::measure_rows(model, context, repeats, max_rows, Some(&sampler))
    }

    fn measure_rows(
        model: &Model,
        context: usize,
        repeats: usize,
        max_rows: usize,
        sampler: Option<&crate::sample::Sampler>,
    ) -> Result<CostCurve> {
        let max_rows = max_rows.max(2);
        let mut s = Scratch::default();
        let mut kv: KvCache = model.new_kv(context + max_rows + 8);
        let toks = synthetic_tokens(model, context.max(1) + max_rows);
        let pos = |a: usize, n: usize| (a..a + n).map(|p| Pos(p as u32)).collect::<Vec<_>>();
        prefill(model, &mut kv, &toks[..context.max(1)], &[], &mut s)?;
        let base = kv.len();
        let spec = OutputSpec {
            rows: Rows::All,
            logits: match sampler {
                Some(s) if s.rescores() => Logits::Screened,
                Some(_) => Logits::Full,
                None => Logits::Argmax,
            },
            taps: vec![],
        };
        let sizes: Vec<usize> = std::iter::successors(Some(1usize), |&r| {
            (r < max_rows).then(|| (r * 2).min(max_rows))
        })
        .collect();
        let mut once = |rows: usize| -> Result<f64> {
            let t = Instant::now();
            model.forward(
                &mut kv,
                &Batch {
                    tokens: &toks[base..base + rows],
                    positions: &pos(base, rows),
                    mask: None,
                },
                &spec,
                &mut s,
            )?;
            if let Some(sampler) = sampler {
                let margin = model.rescore_margin(spec.logits);
                for r in 0..rows {
                    let row = s.out.logits_row(r);
                    std::hint::black_box(if sampler.rescores() {
                        sampler.sample_rescored(row, r, |t| model.rescore(&s, r, t), margin)
                    } else {
                        sampler.sample_at(row, r)
                    });
                }
            }
            let ms = t.elapsed().as_secs_f64() * 1e3;
            kv.truncate(base);
            Ok(ms)
        };
        // The first forwards after loading or after a long prefill run slow (on a 2-vCPU Xeon
        // the first three one-row forwards after a 320-token prefill took 1.8×, 1.7×, 1.3× the
        // steady ones: `examples/after_prefill.rs`), and a curve whose c(1) is taken there prices extra rows too cheaply: decoding
        // runs in the steady state, so the curve is measured there.
        for _ in 0..WARM_FORWARDS {
            once(1)?;
        }
        // Sizes interleaved, so a slow stretch of a shared machine spreads over all of them.
        let mut best = vec![f64::INFINITY; sizes.len()];
        for _ in 0..repeats.max(1) {
            for (b, &rows) in best.iter_mut().zip(&sizes) {
                *b = b.min(once(rows)?);
            }
        }
        let points = sizes.into_iter().zip(best).collect();
        Ok(CostCurve { points })
    }

    /// A drafter's own cost curve: ms of one `propose` of up to n nodes (n = 1, 2, 4, 8 and
    /// `max_nodes`; min of `repeats`) after a `context`-token prompt whose states it was given.
    /// A parallel drafter's pass has a fixed part and a per-slot part, which a per-node rate
    /// cannot express.
    pub fn measure_drafter(
        target: &Model,
        drafter: &mut dyn Drafter,
        context: usize,
        max_nodes: usize,
        repeats: usize,
    ) -> Result<CostCurve> {
        let toks = synthetic_tokens(target, context.max(2));
        let n = toks.len() - 1;
        let mut kv: KvCache = target.new_kv(toks.len() + 1);
        let mut s = Scratch::default();
        let taps = drafter.taps().to_vec();
        let out = prefill(target, &mut kv, &toks[..n], &taps, &mut s)?;
        let width = taps.len() * target.config.hidden_size;
        drafter.begin(
            &toks[..n],
            Hidden {
                width,
                rows: &out.hidden,
            },
        )?;
        let mut sizes: Vec<usize> = [1, 2, 4, 8]
            .into_iter()
            .filter(|&k| k < max_nodes)
            .collect();
        sizes.push(max_nodes.max(1));
        let mut points = vec![];
        for k in sizes {
            let mut best = f64::INFINITY;
            for _ in 0..repeats.max(1) {
                let t = Instant::now();
                drafter.propose(&toks, k)?;
                best = best.min(t.elapsed().as_secs_f64() * 1e3);
            }
            points.push((k, best));
        }
        Ok(CostCurve { points })
    }

    /// Whether the curve can price a forward: two or more points, rows increasing from 1 or
    /// more, every cost finite and positive (a curve read from a file is checked).
    pub fn is_valid(&self) -> bool {
        let p = &self.points;
        p.len() >= 2
            && p[0].0 >= 1
            && p.windows(2).all(|w| w[0].0 < w[1].0)
            && p.iter().all(|&(_, ms)| ms.is_finite() && ms > 0.0)
    }

    pub fn ms(&self, rows: usize) -> f64 {
        let p = &self.points;
        if rows <= p[0].0 {
            return p[0].1;
        }
        for w in p.windows(2) {
            let ((r0, c0), (r1, c1)) = (w[0], w[1]);
            if rows <= r1 {
                return c0 + (c1 - c0) * (rows - r0) as f64 / (r1 - r0) as f64;
            }
        }
        let ((r0, c0), (r1, c1)) = (p[p.len() - 2], p[p.len() - 1]);
        c1 + (c1 - c0) / (r1 - r0) as f64 * (rows - r1) as f64
    }
}

/// The curves a drafter set measured, kept in a file between processes
/// (`DrafterSet::persist`): what a fresh `paradraft generate` would otherwise spend 0.1–0.25 s
/// measuring before its first token (2-vCPU Zen 5, SmolLM2-135M: about 110 ms at T = 0 and
/// 240 ms at T > 0, as long as a 128-token answer takes to decode).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SavedCosts {
    /// The target's verify cost ([`CostCurve::measure`]).
    pub target: Option<CostCurve>,
    /// The drafter's proposal cost ([`CostCurve::measure_drafter`]).
    pub drafter: Option<CostCurve>,
    /// The target's verify cost at T > 0 ([`CostCurve::measure_sampled`]).
    pub sampled: Option<CostCurve>,
}

impl SavedCosts {
    /// What `file` holds; nothing when it is missing, unreadable, not this format or holds
    /// a curve that cannot price a forward (each such curve is measured again).
    pub fn read(file: &std::path::Path) -> SavedCosts {
        let Some(s) = std::fs::read(file)
            .ok()
            .and_then(|b| serde_json::from_slice::<SavedCosts>(&b).ok())
        else {
            return SavedCosts::default();
        };
        let keep = |c: Option<CostCurve>| c.filter(CostCurve::is_valid);
        SavedCosts {
            target: keep(s.target),
            drafter: keep(s.drafter),
            sampled: keep(s.sampled),
        }
    }

    /// Writes the curves to `file` (whole or not at all: a temporary file renamed); a cache,
    /// so a failure only costs the next process a measurement.
    pub fn write(&self, file: &std::path::Path) {
        super::keep_json(file, self);
        if let Some(dir) = file.parent() {
            prune_costs(dir, KEPT_COSTS);
        }
    }
}

/// Cost files a directory keeps: each build, CPU, model and drafter configuration writes its
/// own, so without a bound every rebuild would leave one behind for good.
const KEPT_COSTS: usize = 32;

/// Removes the least recently written `*-costs-*.json` files of `dir` beyond `keep` (errors
/// ignored: the files are a cache).
fn prune_costs(dir: &std::path::Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, std::path::PathBuf)> = entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.contains("-costs-") && name.ends_with(".json")
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if files.len() <= keep {
        return;
    }
    files.sort();
    for (_, path) in &files[..files.len() - keep] {
        let _ = std::fs::remove_file(path);
    }
}

/// Untimed one-row forwards before a curve is timed ([`CostCurve::measure`]).
pub const WARM_FORWARDS: usize = 6;

/// Forward sizes (rows) whose cost is learned from rounds.
const LEARNED_ROWS: usize = 64;
/// Weight of the measured curve against the rounds' clock, in rounds.
const PRIOR_ROUNDS: f64 = 2.0;
/// Forgetting per observation of one size (≈ 50 rounds remembered).
const COST_DECAY: f64 = 0.98;

/// The verify cost the rounds themselves pay: the measured [`CostCurve`] (the best of a few
/// quiet forwards) corrected, per forward size, by the ratio of what rounds of that size took
/// to what the curve predicted. On a 2-vCPU Zen 4 VM, MT-Bench rounds verifying 2–5 rows took
/// 1.19–1.65× an AR round where the measured curve said 1.16 at 4 rows, so a curve taken at
/// its best prices extra rows too cheaply. Sizes no round has used take the ratio of the nearest size
/// that one has (1 before any round).
#[derive(Clone, Debug)]
pub struct LearnedCost {
    prior: CostCurve,
    /// Per forward size (index rows − 1): decayed (Σ measured / predicted, rounds).
    seen: Vec<(f64, f64)>,
}

impl LearnedCost {
    pub fn new(prior: CostCurve) -> Self {
        LearnedCost {
            prior,
            seen: vec![(0.0, 0.0); LEARNED_ROWS],
        }
    }

    /// The measured curve this starts from.
    pub fn prior(&self) -> &CostCurve {
        &self.prior
    }

    /// Expected ms of a forward over `rows` rows.
    pub fn ms(&self, rows: usize) -> f64 {
        self.prior.ms(rows) * self.ratio(rows)
    }

    /// What `rows` rows add to a forward that already holds `base` rows: c(base + rows) −
    /// c(base), both at the learned correction of the whole forward's size (so that it never
    /// goes negative where neighbouring sizes were corrected apart). `base` 0: c(rows).
    pub fn added_ms(&self, base: usize, rows: usize) -> f64 {
        if base == 0 {
            return self.ms(rows);
        }
        let total = base + rows;
        (self.prior.ms(total) - self.prior.ms(base)).max(0.0) * self.ratio(total)
    }

    /// What rounds of about `rows` rows took over what the curve predicts (with the curve's
    /// own 1 as a prior of [`PRIOR_ROUNDS`] rounds).
    pub fn ratio(&self, rows: usize) -> f64 {
        let i = rows.clamp(1, LEARNED_ROWS) - 1;
        let near = (0..LEARNED_ROWS)
            .filter(|&j| self.seen[j].1 > 0.0)
            .min_by_key(|&j| (j.abs_diff(i), j));
        match near {
            Some(j) => {
                let (sum, n) = self.seen[j];
                (sum + PRIOR_ROUNDS) / (n + PRIOR_ROUNDS)
            }
            None => 1.0,
        }
    }

    /// A forward of `rows` rows took `ms` (a round's verify: forward, verification, commit).
    /// One slow round (the VM pausing a vCPU) counts at most 4× the prediction.
    pub fn observe(&mut self, rows: usize, ms: f64) {
        let predicted = self.prior.ms(rows);
        if rows == 0 || rows > LEARNED_ROWS || !(ms.is_finite() && ms > 0.0 && predicted > 0.0) {
            return;
        }
        let r = (ms / predicted).clamp(0.25, 4.0);
        let e = &mut self.seen[rows - 1];
        *e = (e.0 * COST_DECAY + r, e.1 * COST_DECAY + 1.0);
    }
}

/// `n` fixed, spread-out token ids for timing runs.
fn synthetic_tokens(model: &Model, n: usize) -> Vec<TokenId> {
    let vocab = model.config.vocab_size as u32;
    (0..n as u32)
        .map(|i| TokenId((i * 7919 + 11) % vocab))
        .collect()
}

/// Runs `toks` from position 0 into `kv` (no logits), returning the taps' outputs.
fn prefill<'s>(
    model: &Model,
    kv: &mut KvCache,
    toks: &[TokenId],
    taps: &[usize],
    s: &'s mut Scratch,
) -> Result<&'s crate::model::Output> {
    let pos: Vec<Pos> = (0..toks.len() as u32).map(Pos).collect();
    let spec = OutputSpec {
        rows: Rows::Last,
        logits: Logits::None,
        taps: taps.to_vec(),
    };
    let b = Batch {
        tokens: toks,
        positions: &pos,
        mask: None,
    };
    model.forward(kv, &b, &spec, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(points: &[(usize, f64)]) -> CostCurve {
        CostCurve {
            points: points.to_vec(),
        }
    }

    /// A directory keeps the most recently written cost files up to its bound; other files
    /// (the guards' memories) are never removed.
    #[test]
    fn old_cost_files_are_pruned_beyond_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        for i in 0..10u64 {
            let f = dir.path().join(format!("auto-{i:016x}-costs-32.json"));
            std::fs::write(&f, "{}").unwrap();
            let at = t0 + std::time::Duration::from_secs(i);
            std::fs::File::options()
                .write(true)
                .open(&f)
                .unwrap()
                .set_modified(at)
                .unwrap();
        }
        std::fs::write(dir.path().join("auto-0-greedy.json"), "{}").unwrap();
        prune_costs(dir.path(), 4);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut want: Vec<String> = (6..10u64)
            .map(|i| format!("auto-{i:016x}-costs-32.json"))
            .chain(["auto-0-greedy.json".to_string()])
            .collect();
        want.sort();
        assert_eq!(left, want);
    }

    /// Kept curves come back as written; a missing, garbled or foreign file is nothing kept,
    /// and a curve that cannot price a forward is dropped alone (measured again), never used.
    #[test]
    fn kept_costs_round_trip_and_bad_ones_are_measured_again() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sub").join("costs.json");
        assert_eq!(SavedCosts::read(&file), SavedCosts::default());
        let kept = SavedCosts {
            target: Some(curve(&[(1, 2.0), (2, 2.1), (4, 2.6), (32, 12.9)])),
            drafter: Some(curve(&[(1, 0.3), (8, 0.5)])),
            sampled: None,
        };
        kept.write(&file);
        assert_eq!(SavedCosts::read(&file), kept);
        std::fs::write(&file, b"{\"target\": [1, 2").unwrap();
        assert_eq!(SavedCosts::read(&file), SavedCosts::default());
        std::fs::write(&file, b"[1, 2, 3]").unwrap();
        assert_eq!(SavedCosts::read(&file), SavedCosts::default());
        for bad in [
            r#"{"points": [[1, 2.0]]}"#,
            r#"{"points": [[0, 1.0], [2, 2.0]]}"#,
            r#"{"points": [[2, 2.0], [1, 1.0]]}"#,
            r#"{"points": [[1, 2.0], [2, -1.0]]}"#,
            r#"{"points": [[1, 2.0], [2, 0.0]]}"#,
            r#"{"points": []}"#,
        ] {
            let text = format!(
                r#"{{"target": {bad}, "drafter": {{"points": [[1, 0.3], [8, 0.5]]}}, "sampled": null}}"#
            );
            std::fs::write(&file, text).unwrap();
            let read = SavedCosts::read(&file);
            assert!(read.target.is_none(), "{bad}");
            assert_eq!(read.drafter, kept.drafter);
        }
    }
}
