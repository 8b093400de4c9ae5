//! A drafter training campaign that accrues across sessions (DART, then DFlash and PARD on the
//! same pipeline: [`CampaignMethod`]): one directory (by default `$HOME/.cache/paradraft/campaign/<method>`)
//! holds THE run: its stamp, its growing self-distilled data, rotating checkpoints (weights +
//! AdamW moments + progress), the step log and the held-out curve. Every start resumes from
//! the newest checkpoint that loads, or from a published drafter when there is none; the
//! process can be killed at any moment.
//!
//! Online teacher forcing: the target's taps and its distribution over the draft vocabulary are
//! computed inside each step from token sequences ([`TapSource::Online`]), so the data is only
//! tokens: the self-distilled samples (greedy answers; their own tokens are the labels) and
//! corpus text (the target's argmax and soft distribution are the labels; see
//! [`crate::train::dart::build`]). Training runs in rounds: train for `round_s` seconds, save,
//! self-distil more samples for a `distill_share` of the time, evaluate every `eval_every` steps.

mod data;
mod store;
mod student;

pub use data::{corpus_samples, prepare, Prepared, Sources};
use data::{Pools, Snapshot};
pub use store::{
    check_stamp, process_cpu_s, read_curve, resume, save, CurvePoint, Progress, Stamp, StepLog,
};
pub use student::{CampaignMethod, Shape, Student};

use crate::drafters::vocab::DraftVocab;
use crate::error::{Error, Result};
use crate::model::Loaded;
use crate::train::bf16::{set_matmul_precision, MatmulPrecision};
use crate::train::data::{distill, distill_sampled, DistillParams, Prompt, Sample};
use crate::train::dflash::net::FrozenHead;
use crate::train::features::{OnlineTaps, TapSource};
use crate::train::optim::AdamW;
use crate::train::run::{self, cerr};
use candle_core::Tensor;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;
use store::{append_line, cut_log, write_atomic};

/// The campaign's settings (stored in `campaign.json`; a resumed run uses the caller's).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Params {
    pub batch_seqs: usize,
    /// Prefixes per sequence given a block of mask slots.
    pub anchors: usize,
    pub gamma: f32,
    pub kl_weight: f64,
    /// Constant learning rate after a linear warm-up of `warmup_steps` (from each start: the
    /// moments are restored, the warm-up only guards a start without them). 3e-4 until step
    /// 4022 of THE campaign, 1e-4 since (its late phase: EAGLE-style drafters train at
    /// 3e-5–1e-4).
    pub lr: f64,
    pub warmup_steps: usize,
    pub grad_clip: f64,
    /// Share of sequences drawn from the corpus (the rest: self-distilled samples).
    pub corpus_share: f64,
    /// Steps between held-out evaluations.
    pub eval_every: usize,
    /// Seconds of training between checkpoints (a round).
    pub round_s: f64,
    /// Share of the wall time spent self-distilling new samples (0: none).
    pub distill_share: f64,
    /// Sequences self-distilled at once.
    pub gen_seqs: usize,
    pub max_new_tokens: usize,
    pub seed: u64,
    /// Decay of the weights' moving average, which is what is evaluated and exported (a
    /// constant learning rate keeps the raw weights noisy; the average is their annealed view).
    /// 0: the raw weights.
    #[serde(default)]
    pub ema_decay: f64,
    /// Training matmuls with bf16 products and f32 sums where the CPU has AVX-512 BF16 (about
    /// 1.15–1.25× the positions per second here; `train::bf16`); held-out evaluation stays f32.
    #[serde(default)]
    pub bf16_matmul: bool,
    /// Temperature of sampled self-distillation (0: none): once every prompt has its greedy
    /// answer, the distillation rounds answer the training prompts again at this temperature
    /// with fresh seeds — data beyond the prompt pool. Sampled text is teacher-labelled (see
    /// [`crate::train::dart::build`]); per trained position it measured as good as greedy
    /// text for held-out α1 (docs/dart_campaign.md), so greedy answers come first.
    #[serde(default)]
    pub sample_temp: f32,
    /// Share of the self-distilled sequences drawn from the sampled ones (`None`: every
    /// training sample, greedy or sampled, equally likely).
    #[serde(default)]
    pub sampled_share: Option<f64>,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            batch_seqs: 4,
            anchors: 48,
            gamma: 0.6,
            kl_weight: 1.0,
            lr: 1e-4,
            warmup_steps: 50,
            grad_clip: 0.5,
            // Measured: target-labelled corpus text lowers held-out α per trained position
            // against self-distilled text (docs/dart_campaign.md); kept for experiments.
            corpus_share: 0.0,
            eval_every: 600,
            round_s: 600.0,
            // 0.3 until step ~5500 of the CPU phase, then 0.1 (each sample had been drawn ~1.1
            // times). 0.5 since the GPU run: it trained the data to saturation (13 visits per
            // sample; the CPU's first 600 steps after it left α1 at 0.726), so new
            // self-distilled text is what the next run needs (docs/dart_campaign.md).
            distill_share: 0.5,
            gen_seqs: 16,
            max_new_tokens: 256,
            seed: 0,
            ema_decay: 0.998,
            bf16_matmul: true,
            sample_temp: 0.8,
            sampled_share: None,
        }
    }
}

impl Params {
    fn precision(&self) -> MatmulPrecision {
        if self.bf16_matmul {
            MatmulPrecision::Bf16
        } else {
            MatmulPrecision::F32
        }
    }

    /// Refuses settings the campaign cannot run with, naming the setting and its range.
    pub fn validate(&self) -> Result<()> {
        let checks = [
            (self.lr > 0.0 && self.lr.is_finite(), "lr must be > 0"),
            (self.kl_weight >= 0.0, "kl weight must be ≥ 0"),
            (
                self.batch_seqs > 0 && self.anchors > 0,
                "batch seqs and anchors must be ≥ 1",
            ),
            (
                self.gamma > 0.0 && self.gamma.is_finite(),
                "gamma must be > 0",
            ),
            (self.round_s >= 0.0, "the round (save every) must be ≥ 0"),
            (
                (0.0..=1.0).contains(&self.corpus_share),
                "corpus share must be in [0, 1]",
            ),
            (
                (0.0..0.95).contains(&self.distill_share),
                "distill share must be in [0, 0.95)",
            ),
            (
                self.eval_every > 0 && self.gen_seqs > 0,
                "eval every and gen seqs must be ≥ 1",
            ),
            (
                (0.0..=2.0).contains(&self.sample_temp),
                "the sampling temperature must be in [0, 2]",
            ),
            (
                self.sampled_share.is_none_or(|x| (0.0..=1.0).contains(&x)),
                "the sampled share must be in [0, 1]",
            ),
        ];
        match checks.iter().find(|c| !c.0) {
            Some((_, why)) => Err(Error::BadRequest(format!("campaign settings: {why}"))),
            None => Ok(()),
        }
    }
}

/// Everything a campaign trains and evaluates on. `samples` = the self-distilled samples (the
/// file grows as the campaign distils), `held_out` their indices never trained on; `corpus`
/// follows them in the training data with target labels.
pub struct Setup<'a> {
    pub dir: &'a Path,
    pub lm: &'a Loaded,
    pub vocab: &'a DraftVocab,
    pub shape: &'a Shape,
    pub held_out: Vec<usize>,
    pub corpus: Vec<Sample>,
    /// Prompts for self-distillation (indices are the samples' `prompt_index`).
    pub prompts: &'a [Prompt],
    /// The drafter a campaign without a checkpoint starts from.
    pub start: &'a dyn Fn() -> Result<Student>,
}

/// Something the campaign reports while it runs.
pub enum Event<'a> {
    Note(String),
    Step(&'a StepLog),
    Eval(&'a CurvePoint),
}

impl std::fmt::Display for Event<'_> {
    /// The line a progress log prints (empty for the steps between every 25th).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::Note(n) => f.write_str(n),
            Event::Step(l) if l.step.is_multiple_of(25) => write!(
                f,
                "step {} loss {:.4} acc1 {:.3} lr {:.1e} |g| {:.2} {} positions {:.2}s",
                l.step, l.loss, l.acc1, l.lr, l.grad_norm, l.positions, l.secs
            ),
            Event::Step(_) => Ok(()),
            Event::Eval(c) => write!(
                f,
                "held-out at step {} ({} positions, {:.2} CPU-hours): {}",
                c.progress.step,
                c.progress.positions,
                c.progress.cpu_s / 3600.0,
                c.eval
            ),
        }
    }
}

/// Draws the held-out curve of the campaign in `dir` (α1 and expected τ against CPU-hours and
/// trained positions, the goal α1 0.7) as an SVG at `out`, titled `title`.
pub fn plot_curve(dir: &Path, out: &Path, title: &str) -> Result<()> {
    let pts: Vec<(f64, f64, f64, f64)> = read_curve(dir)?
        .iter()
        .map(|c| {
            let p = &c.progress;
            let a1 = c.eval.alpha.first().copied().unwrap_or(0.0);
            (
                p.cpu_s / 3600.0,
                p.positions as f64 / 1e6,
                a1,
                c.eval.expected_tau,
            )
        })
        .collect();
    if pts.is_empty() {
        return Err(Error::BadRequest(format!(
            "{} has no held-out evaluations yet",
            dir.join("curve.jsonl").display()
        )));
    }
    crate::train::plot::curve_svg(&pts, 0.7, title, out)
}

/// Runs the campaign until `stop()` says so (checked between steps; a checkpoint is written
/// before returning) or the process is killed.
pub fn run(
    s: &Setup,
    p: &Params,
    mut stop: impl FnMut(&Progress) -> bool,
    mut on: impl FnMut(Event),
) -> Result<Progress> {
    p.validate()?;
    s.shape.check(p)?;
    set_matmul_precision(p.precision());
    let target = &s.lm.model;
    let teacher = Teacher::new(s)?;
    let head = &teacher.head;
    let samples_path = s.dir.join("samples.bin");
    let (net, mut opt, mut pr, mut ema) = match resume(s.dir, s.shape, |w| on(Event::Note(w))) {
        Some((net, tensors, pr, ema)) => {
            let mut opt = AdamW::new(net.vars(), 0.0).map_err(cerr)?;
            opt.load_state(&tensors, pr.step).map_err(cerr)?;
            on(Event::Note(format!("resumed at {pr}")));
            let ema = match ema {
                Some(t) => Ema {
                    decay: p.ema_decay,
                    t,
                },
                None => Ema::of(net.vars(), p.ema_decay)?,
            };
            (net, opt, pr, ema)
        }
        None => {
            let net = (s.start)()?;
            let opt = AdamW::new(net.vars(), 0.0).map_err(cerr)?;
            on(Event::Note(
                "no checkpoint: starting from the drafter".into(),
            ));
            let ema = Ema::of(net.vars(), p.ema_decay)?;
            (net, opt, Progress::default(), ema)
        }
    };
    let start_step = pr.step;
    cut_log(&s.dir.join("train_log.jsonl"), pr.step)?;
    cut_log(&s.dir.join("curve.jsonl"), pr.step)?;
    let (cpu0, wall0) = (process_cpu_s(), Instant::now());
    let base = pr.clone();
    let now = |pr: &mut Progress| {
        pr.cpu_s = base.cpu_s + process_cpu_s() - cpu0;
        pr.wall_s = base.wall_s + wall0.elapsed().as_secs_f64();
    };
    let mut distill_rate = 0.0f64; // samples per second, measured
    let mut prompts_left = true;
    loop {
        let snap = Snapshot::read(s)?;
        if pr.step == start_step && !snap.pools.sampled.is_empty() {
            let n = snap.pools.sampled.len();
            on(Event::Note(format!("{n} sampled self-distilled samples")));
        }
        let data = snap.data(s, &teacher);
        let ctx = (s, &data, head);
        if pr.step == 0 && read_curve(s.dir)?.is_empty() {
            let point = (&snap.pools, p.lr);
            evaluate(ctx, &ema.net(s.shape)?, &mut pr, point, &now, &mut on)?;
        }
        // A round: at least one step, then until `round_s` has passed.
        let t_round = Instant::now();
        loop {
            if stop(&pr) {
                now(&mut pr);
                save(s.dir, &net, &opt, &ema.t, &pr)?;
                return Ok(pr);
            }
            let log = step(&net, head, &data, &snap.pools, p, &mut opt, &mut pr)?;
            ema.update(net.vars())?;
            append_line(&s.dir.join("train_log.jsonl"), &log)?;
            on(Event::Step(&log));
            if pr.step.is_multiple_of(p.eval_every.max(1)) {
                let point = (&snap.pools, p.lr);
                evaluate(ctx, &ema.net(s.shape)?, &mut pr, point, &now, &mut on)?;
            }
            if t_round.elapsed().as_secs_f64() >= p.round_s {
                break;
            }
        }
        now(&mut pr);
        save(s.dir, &net, &opt, &ema.t, &pr)?;
        drop(data);
        if p.distill_share > 0.0 {
            let secs = p.round_s * p.distill_share / (1.0 - p.distill_share).max(0.05);
            let want = if distill_rate > 0.0 {
                (secs * distill_rate).round().max(1.0) as usize
            } else {
                p.gen_seqs.max(1) * 2
            };
            let sampled = p.sample_temp > 0.0 && !prompts_left;
            let dp = DistillParams {
                samples: snap.pools.n_greedy + want,
                max_new_tokens: p.max_new_tokens,
                max_prompt_tokens: 1024,
                seqs: p.gen_seqs.max(1),
                capture: None,
            };
            let (tok, t0) = (&s.lm.tokenizer, Instant::now());
            // A stop asked for meanwhile lets the answers under way finish; the next round
            // then checkpoints before its first step, with this round's CPU time counted.
            let halt = || stop(&pr);
            let (added, total) = if sampled {
                let added = sample_more(s, &snap.pools, p, &dp, halt)?;
                (added, snap.pools.sampled.len() + added)
            } else {
                let got = distill(target, tok, s.prompts, &samples_path, &dp, |_, _| {}, halt)?;
                let added = got.len() - snap.pools.n_greedy;
                prompts_left &= added > 0;
                (added, got.len())
            };
            let dt = t0.elapsed().as_secs_f64();
            if added > 0 {
                distill_rate = added as f64 / dt.max(1e-3);
            }
            let kind = if sampled { "sampled" } else { "greedy" };
            on(Event::Note(format!(
                "self-distilled {added} {kind} samples in {dt:.0} s ({total} {kind} in all)"
            )));
        }
    }
}

/// Self-distils the next `dp.samples - pools.n_greedy` sampled samples (see
/// [`Params::sample_temp`]) into `DIR/sampled.bin`; returns how many were added. `stop()` is
/// asked before each new answer is started.
fn sample_more(
    s: &Setup,
    pools: &Pools,
    p: &Params,
    dp: &DistillParams,
    stop: impl FnMut() -> bool,
) -> Result<usize> {
    let which = pools.next_sampled(dp.samples.saturating_sub(pools.n_greedy), p.seed);
    let (model, tok, path) = (&s.lm.model, &s.lm.tokenizer, s.dir.join("sampled.bin"));
    distill_sampled(
        model,
        tok,
        s.prompts,
        &which,
        p.sample_temp,
        &path,
        dp,
        stop,
    )
}

/// Grows the campaign's sampled data by `n` samples now (at `p.sample_temp`, `p.gen_seqs` at
/// once), as its distillation rounds would; returns how many were added.
pub fn grow_sampled(s: &Setup, p: &Params, n: usize) -> Result<usize> {
    p.validate()?;
    s.shape.check(p)?;
    if p.sample_temp <= 0.0 {
        return Err(Error::BadRequest(
            "sampled self-distillation needs a sampling temperature above 0".into(),
        ));
    }
    let pools = Snapshot::read(s)?.pools;
    let dp = DistillParams {
        samples: pools.n_greedy + n,
        max_new_tokens: p.max_new_tokens,
        max_prompt_tokens: 1024,
        seqs: p.gen_seqs.max(1),
        capture: None,
    };
    sample_more(s, &pools, p, &dp, || false)
}

/// Index of the sequence a step draws: with probability `corpus_share` a corpus sequence, else
/// a self-distilled training sample (sampled ones with probability `sampled_share`, or in
/// proportion to their number).
fn draw(pools: &Pools, p: &Params, rng: &mut ChaCha8Rng) -> usize {
    let mut unit = || rng.next_u64() as f64 / u64::MAX as f64;
    let corpus = !pools.corpus.is_empty() && unit() < p.corpus_share;
    let sampled_pick = match p.sampled_share {
        Some(x) if !pools.sampled.is_empty() => Some(unit() < x || pools.greedy.is_empty()),
        _ => None,
    };
    let (g, n) = (pools.greedy.len(), pools.sampled.len());
    let pick = |range: &std::ops::Range<usize>, rng: &mut ChaCha8Rng| {
        range.start + (rng.next_u64() % range.len().max(1) as u64) as usize
    };
    if corpus || g + n == 0 {
        return pick(&pools.corpus, rng);
    }
    match sampled_pick {
        Some(true) => pick(&pools.sampled, rng),
        Some(false) => pools.greedy[(rng.next_u64() % g as u64) as usize],
        None => match (rng.next_u64() % (g + n) as u64) as usize {
            i if i < g => pools.greedy[i],
            i => pools.sampled.start + i - g,
        },
    }
}

/// One optimiser step over `batch_seqs` sequences drawn (seeded by the step, see [`draw`]).
fn step(
    net: &Student,
    head: &FrozenHead,
    data: &run::Data,
    pools: &Pools,
    p: &Params,
    opt: &mut AdamW,
    pr: &mut Progress,
) -> Result<StepLog> {
    let t0 = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(p.seed ^ (pr.step as u64).wrapping_mul(0x9e37_79b9));
    let chunk: Vec<usize> = (0..p.batch_seqs.max(1))
        .map(|_| draw(pools, p, &mut rng))
        .collect();
    let items: Vec<(usize, Vec<usize>)> = chunk
        .iter()
        .map(|&si| (si, net.positions(&data.samples[si], p.anchors, &mut rng)))
        .collect();
    let warm = ((pr.step + 1) as f64 / p.warmup_steps.max(1) as f64).min(1.0);
    let lr = p.lr * warm;
    let (loss, gn, acc1, rows) = match net.loss(head, data, &items, p)? {
        Some((l, acc1, rows)) => {
            let (loss, gn) = run::optimise(net.vars(), opt, &l, lr, p.grad_clip)?;
            (loss, gn, acc1, rows)
        }
        None => (0.0, 0.0, 0.0, 0),
    };
    pr.step += 1;
    pr.positions += rows as u64;
    Ok(StepLog {
        step: pr.step,
        loss,
        acc1,
        lr,
        grad_norm: gn,
        positions: rows,
        secs: t0.elapsed().as_secs_f64(),
    })
}

fn evaluate(
    (s, data, head): (&Setup, &run::Data, &FrozenHead),
    net: &Student,
    pr: &mut Progress,
    (pools, lr): (&Pools, f64),
    now: &impl Fn(&mut Progress),
    on: &mut impl FnMut(Event),
) -> Result<()> {
    let t0 = Instant::now();
    // In f32, so that the curve measures the weights alone, whatever the training precision.
    let was = set_matmul_precision(MatmulPrecision::F32);
    let e = net.evaluate(head, data, &s.held_out);
    set_matmul_precision(was);
    let e = e?;
    now(pr);
    let point = CurvePoint {
        progress: pr.clone(),
        samples: pools.n_greedy,
        sampled: pools.sampled.len(),
        lr: Some(lr),
        eval: e,
    };
    // The best α1 so far, before this point joins the curve: compared with the curve read
    // back, a new maximum could lose to its own JSON round trip by an ulp and never be kept.
    let best = read_curve(s.dir)?
        .iter()
        .map(|c| c.eval.alpha.first().copied().unwrap_or(0.0))
        .fold(0.0, f64::max);
    append_line(&s.dir.join("curve.jsonl"), &point)?;
    on(Event::Note(format!(
        "held-out evaluation took {:.0} s",
        t0.elapsed().as_secs_f64()
    )));
    on(Event::Eval(&point));
    // The latest weights as a drafter, and the best so far by held-out α1.
    let a1 = point.eval.alpha.first().copied().unwrap_or(0.0);
    let mut dirs = vec![s.dir.join("latest")];
    if a1 >= best {
        dirs.push(s.dir.join("best"));
    }
    for d in dirs {
        let tmp = d.with_extension("tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        net.export(s.vocab, &tmp)?;
        write_atomic(
            &tmp.join("eval.json"),
            serde_json::to_string_pretty(&point)
                .expect("json")
                .as_bytes(),
        )?;
        let _ = std::fs::remove_dir_all(&d);
        std::fs::rename(&tmp, &d).map_err(|e| Error::io(&d, e))?;
    }
    Ok(())
}

/// The moving average of the weights (Polyak averaging), started at the weights a run starts
/// from; saved with every checkpoint. Its tensors are plain values: a copy of a variable records
/// the copy in candle's graph, and each update would then keep every earlier average alive (a
/// campaign started without a checkpoint grew by ~40 MB a step until it was killed).
struct Ema {
    decay: f64,
    t: HashMap<String, Tensor>,
}

impl Ema {
    fn of(vars: &run::Vars, decay: f64) -> Result<Self> {
        let t = vars
            .iter()
            // A copy: the optimiser updates the variables' storage in place.
            .map(|(k, v)| Ok((k.clone(), v.as_tensor().detach().copy().map_err(cerr)?)))
            .collect::<Result<_>>()?;
        Ok(Ema { decay, t })
    }

    fn update(&mut self, vars: &run::Vars) -> Result<()> {
        for (k, v) in vars {
            let w = v.as_tensor().detach();
            let e = match self.t.get(k) {
                Some(e) if self.decay > 0.0 => ((e * self.decay).map_err(cerr)?
                    + (w * (1.0 - self.decay)).map_err(cerr)?)
                .map_err(cerr)?,
                _ => w.copy().map_err(cerr)?,
            };
            self.t.insert(k.clone(), e);
        }
        Ok(())
    }

    fn net(&self, shape: &Shape) -> Result<Student> {
        shape.net(&self.t).map_err(cerr)
    }
}

/// The target's part of every step: its online taps and its frozen head over the draft
/// vocabulary (for its distribution).
struct Teacher {
    source: TapSource,
    head: FrozenHead,
}

impl Teacher {
    fn new(s: &Setup) -> Result<Self> {
        let target = &s.lm.model;
        let (taps, ctx) = s.shape.taps(target)?;
        Ok(Teacher {
            source: TapSource::Online(OnlineTaps::new(target, &taps, ctx)?),
            head: crate::train::dflash::frozen_head(target, s.vocab).map_err(cerr)?,
        })
    }
}

/// Training throughput: `steps` steps from the start drafter (nothing saved), in scored
/// positions per second and seconds per step, after one warm-up step.
pub fn bench(s: &Setup, p: &Params, steps: usize) -> Result<(f64, f64)> {
    s.shape.check(p)?;
    set_matmul_precision(p.precision());
    let teacher = Teacher::new(s)?;
    let snap = Snapshot::read(s)?;
    let data = snap.data(s, &teacher);
    let head = &teacher.head;
    let net = (s.start)()?;
    let mut opt = AdamW::new(net.vars(), 0.0).map_err(cerr)?;
    let mut pr = Progress::default();
    step(&net, head, &data, &snap.pools, p, &mut opt, &mut pr)?;
    let (t0, pos0) = (Instant::now(), pr.positions);
    for _ in 0..steps.max(1) {
        step(&net, head, &data, &snap.pools, p, &mut opt, &mut pr)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok((
        (pr.positions - pos0) as f64 / secs,
        secs / steps.max(1) as f64,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    #[test]
    fn the_moving_average_keeps_no_graph_and_averages() {
        let mut vars = run::Vars::new();
        let w = Var::from_tensor(&Tensor::ones(4, DType::F32, &Device::Cpu).unwrap()).unwrap();
        vars.insert("w".into(), w.clone());
        let mut ema = Ema::of(&vars, 0.5).unwrap();
        w.set(&Tensor::full(3f32, 4, &Device::Cpu).unwrap())
            .unwrap();
        for _ in 0..2 {
            ema.update(&vars).unwrap();
        }
        let t = &ema.t["w"];
        assert!(!t.track_op(), "the average must not hold candle's graph");
        // 1 → 0.5·1 + 0.5·3 = 2 → 0.5·2 + 0.5·3 = 2.5
        assert_eq!(t.to_vec1::<f32>().unwrap(), vec![2.5f32; 4]);
    }
}
