//! A DART training campaign that accrues across sessions: one directory (by default
//! `$HOME/.cache/paradraft/campaign/dart`) holds THE run: its stamp, its growing self-distilled
//! data, rotating checkpoints (weights + AdamW moments + progress), the step log and the
//! held-out curve. Every start resumes from the newest checkpoint that loads, or from a
//! published drafter when there is none; the process can be killed at any moment.
//!
//! Online teacher forcing: the target's taps and its distribution over the draft vocabulary are
//! computed inside each step from token sequences ([`TapSource::Online`]), so the data is only
//! tokens: the self-distilled samples (greedy answers; their own tokens are the labels) and
//! corpus text (the target's argmax and soft distribution are the labels; see
//! [`crate::train::dart::build`]). Training runs in rounds: train for `round_s` seconds, save,
//! self-distil more samples for a `distill_share` of the time, evaluate every `eval_every` steps.

use crate::drafters::dart::DartConfig;
use crate::drafters::vocab::DraftVocab;
use crate::error::{Error, Result};
use crate::model::{Loaded, Message};
use crate::train::dart::{self, net::Net};
use crate::train::data::{distill, read_samples, DistillParams, Prompt, Sample};
use crate::train::features::{OnlineTaps, TapSource};
use crate::train::optim::AdamW;
use crate::train::run::{self, cerr, Eval};
use candle_core::{Device, Tensor};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The campaign's settings (stored in `campaign.json`; a resumed run uses the caller's).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Params {
    pub batch_seqs: usize,
    /// Prefixes per sequence given a block of mask slots.
    pub anchors: usize,
    pub gamma: f32,
    pub kl_weight: f64,
    /// Constant learning rate after a linear warm-up of `warmup_steps` (from each start: the
    /// moments are restored, the warm-up only guards a start without them).
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
}

impl Default for Params {
    fn default() -> Self {
        Params {
            batch_seqs: 4,
            anchors: 48,
            gamma: 0.6,
            kl_weight: 1.0,
            lr: 3e-4,
            warmup_steps: 50,
            grad_clip: 0.5,
            corpus_share: 0.25,
            eval_every: 600,
            round_s: 600.0,
            distill_share: 0.2,
            gen_seqs: 16,
            max_new_tokens: 256,
            seed: 0,
        }
    }
}

impl Params {
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
                self.gamma > 0.0 && self.gamma <= 1.0,
                "gamma must be in (0, 1]",
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
        ];
        match checks.iter().find(|c| !c.0) {
            Some((_, why)) => Err(Error::BadRequest(format!("campaign settings: {why}"))),
            None => Ok(()),
        }
    }
}

/// `$HOME/.cache/paradraft/campaign/dart`: outside any work tree, so a campaign outlives clones.
pub fn default_dir() -> PathBuf {
    dirs::home_dir()
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".cache/paradraft/campaign/dart")
}

/// What identifies a campaign: its target, tokenizer, drafter shape and draft vocabulary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stamp {
    pub target_layers: usize,
    pub target_hidden: usize,
    pub target_vocab: usize,
    pub tokenizer_fingerprint: String,
    pub draft_vocab_fingerprint: String,
    pub drafter: serde_json::Value,
}

impl Stamp {
    pub fn new(lm: &Loaded, config: &DartConfig, vocab: &DraftVocab) -> Self {
        let c = &lm.model.config;
        Stamp {
            target_layers: c.n_layers,
            target_hidden: c.hidden_size,
            target_vocab: c.vocab_size,
            tokenizer_fingerprint: format!("{:016x}", lm.tokenizer.fingerprint()),
            draft_vocab_fingerprint: format!("{:016x}", fnv(&vocab.d2t)),
            drafter: config.to_json(),
        }
    }
}

fn fnv(xs: &[u32]) -> u64 {
    xs.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// How far the campaign has come (saved with every checkpoint).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Progress {
    pub step: usize,
    /// Scored rows trained on (clean slots and mask slots).
    pub positions: u64,
    /// CPU seconds of this campaign's processes (training, evaluation, self-distillation).
    pub cpu_s: f64,
    pub wall_s: f64,
}

/// One line of `curve.jsonl`: a held-out evaluation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CurvePoint {
    #[serde(flatten)]
    pub progress: Progress,
    pub samples: usize,
    pub eval: Eval,
}

/// One line of `train_log.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StepLog {
    pub step: usize,
    pub loss: f64,
    pub acc1: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub positions: usize,
    pub secs: f64,
}

/// CPU seconds this process has used (all threads).
pub fn process_cpu_s() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    if r != 0 {
        return 0.0;
    }
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Reads or writes `campaign.json`: a directory made for another target, tokenizer, drafter
/// shape or draft vocabulary is refused.
pub fn check_stamp(dir: &Path, stamp: &Stamp, p: &Params) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let path = dir.join("campaign.json");
    if path.exists() {
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(&path, e))?;
        let have: Stamp = serde_json::from_value(v["stamp"].clone()).map_err(|e| bad(&path, e))?;
        if &have != stamp {
            return Err(Error::BadRequest(format!(
                "campaign directory {} was made for another target, tokenizer or drafter \
                 (its stamp: {} layers, hidden {}, vocabulary {}, tokenizer {}, draft vocabulary \
                 {}; this run: {} layers, hidden {}, vocabulary {}, tokenizer {}, draft \
                 vocabulary {}): pass another --dir",
                dir.display(),
                have.target_layers,
                have.target_hidden,
                have.target_vocab,
                have.tokenizer_fingerprint,
                have.draft_vocab_fingerprint,
                stamp.target_layers,
                stamp.target_hidden,
                stamp.target_vocab,
                stamp.tokenizer_fingerprint,
                stamp.draft_vocab_fingerprint,
            )));
        }
    }
    let v = serde_json::json!({"stamp": stamp, "params": p});
    write_atomic(
        &path,
        serde_json::to_string_pretty(&v).expect("json").as_bytes(),
    )
}

fn bad(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::BadModelFile {
        path: path.to_path_buf(),
        format: "campaign",
        reason: e.to_string(),
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// Checkpoint directories `ckpt/step-NNNNNNNN`, newest first.
fn checkpoints(dir: &Path) -> Vec<(usize, PathBuf)> {
    let mut v: Vec<(usize, PathBuf)> = std::fs::read_dir(dir.join("ckpt"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("step-")?.parse().ok()?;
            Some((step, e.path()))
        })
        .collect();
    v.sort_by_key(|c| std::cmp::Reverse(c.0));
    v
}

/// Writes a checkpoint into a fresh directory, reads it back, then renames it into place
/// (atomic); the two newest are kept. A broken write never replaces a good checkpoint.
pub fn save(dir: &Path, net: &Net, opt: &AdamW, pr: &Progress) -> Result<()> {
    let root = dir.join("ckpt");
    let tmp = root.join(format!("step-{:08}.tmp", pr.step));
    let _ = std::fs::remove_dir_all(&tmp);
    run::save_checkpoint(&tmp, &net.vars, opt, pr.step, pr.wall_s)?;
    write_atomic(
        &tmp.join("progress.json"),
        serde_json::to_string(pr).expect("json").as_bytes(),
    )?;
    load_one(&tmp, &net.config)?;
    let done = root.join(format!("step-{:08}", pr.step));
    let _ = std::fs::remove_dir_all(&done);
    std::fs::rename(&tmp, &done).map_err(|e| Error::io(&done, e))?;
    for (_, old) in checkpoints(dir).into_iter().skip(2) {
        let _ = std::fs::remove_dir_all(old);
    }
    Ok(())
}

type Restored = (Net, HashMap<String, Tensor>, Progress);

fn load_one(ck: &Path, config: &DartConfig) -> Result<Restored> {
    let saved = run::load_checkpoint(ck)?.ok_or_else(|| bad(ck, "no state.safetensors"))?;
    let pp = ck.join("progress.json");
    let text = std::fs::read_to_string(&pp).map_err(|e| Error::io(&pp, e))?;
    let pr: Progress = serde_json::from_str(&text).map_err(|e| bad(&pp, e))?;
    if pr.step != saved.step {
        return Err(bad(ck, "progress.json and state.json disagree on the step"));
    }
    let net = Net::from_tensors(config.clone(), &saved.tensors)
        .map_err(|e| run::broken_checkpoint(ck, e))?;
    Ok((net, saved.tensors, pr))
}

/// The newest checkpoint that loads (broken ones are reported through `warn` and skipped).
pub fn resume(dir: &Path, config: &DartConfig, mut warn: impl FnMut(String)) -> Option<Restored> {
    for (_, ck) in checkpoints(dir) {
        if ck.extension().is_some_and(|e| e == "tmp") {
            continue;
        }
        match load_one(&ck, config) {
            Ok(r) => return Some(r),
            Err(e) => warn(format!("skipping checkpoint {}: {e}", ck.display())),
        }
    }
    None
}

/// Drops lines of a JSONL log whose `step` lies past `step` (written after the checkpoint a
/// run resumes from).
fn cut_log(path: &Path, step: usize) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let kept: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s as usize <= step)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    write_atomic(path, kept.as_bytes())
}

fn append_line(path: &Path, v: &impl Serialize) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    writeln!(f, "{}", serde_json::to_string(v).expect("json")).map_err(|e| Error::io(path, e))
}

/// The held-out evaluations so far.
pub fn read_curve(dir: &Path) -> Result<Vec<CurvePoint>> {
    let path = dir.join("curve.jsonl");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(vec![]);
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| bad(&path, e)))
        .collect()
}

/// Corpus text as training sequences: each record (`{"id", "text"}` JSON Lines, `.gz` read
/// compressed) whose id is a training prompt's becomes that prompt's chat-templated answer (the
/// loss covers the answer); others are raw text cut into pieces of at most `max_len` tokens.
/// Records whose id is in `exclude` (held-out prompts) are left out.
pub fn corpus_samples(
    lm: &Loaded,
    path: &Path,
    prompts: &[Prompt],
    exclude: &HashSet<String>,
    max_len: usize,
) -> Result<Vec<Sample>> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut text = String::new();
    if path.extension().is_some_and(|e| e == "gz") {
        flate2::read::GzDecoder::new(f).read_to_string(&mut text)
    } else {
        std::io::BufReader::new(f).read_to_string(&mut text)
    }
    .map_err(|e| Error::io(path, e))?;
    let by_id: HashMap<&str, &str> = prompts
        .iter()
        .map(|p| (p.id.as_str(), p.prompt.as_str()))
        .collect();
    #[derive(Deserialize)]
    struct Rec {
        id: String,
        text: String,
    }
    let tok = &lm.tokenizer;
    let mut out = vec![];
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: Rec = serde_json::from_str(line).map_err(|e| {
            bad(
                path,
                format!("line {}: {e} (want {{\"id\", \"text\"}})", i + 1),
            )
        })?;
        if exclude.contains(&r.id) || r.text.trim().is_empty() {
            continue;
        }
        match by_id.get(r.id.as_str()) {
            Some(prompt) => {
                let p = tok.encode_chat(&[Message::new("user", prompt)], true)?;
                let full = tok.encode_chat(
                    &[
                        Message::new("user", prompt),
                        Message::new("assistant", &r.text),
                    ],
                    false,
                )?;
                if full.len() > p.len() + 1 && full.starts_with(&p) {
                    let mut tokens = full;
                    tokens.truncate(max_len.max(p.len() + 2));
                    out.push(Sample {
                        prompt_index: i as u32,
                        prompt_len: p.len() as u32,
                        tokens,
                    });
                }
            }
            None => {
                let ids = tok.encode(&r.text)?;
                for piece in ids.chunks(max_len.max(3)) {
                    if piece.len() >= 16.min(max_len.max(3)) {
                        out.push(Sample {
                            prompt_index: i as u32,
                            prompt_len: 0,
                            tokens: piece.to_vec(),
                        });
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Everything a campaign trains and evaluates on. `samples` = the self-distilled samples (the
/// file grows as the campaign distils), `held_out` their indices never trained on; `corpus`
/// follows them in the training data with target labels.
pub struct Setup<'a> {
    pub dir: &'a Path,
    pub lm: &'a Loaded,
    pub vocab: &'a DraftVocab,
    pub config: &'a DartConfig,
    pub held_out: Vec<usize>,
    pub corpus: Vec<Sample>,
    /// Prompts for self-distillation (indices are the samples' `prompt_index`).
    pub prompts: &'a [Prompt],
    /// The drafter a campaign without a checkpoint starts from.
    pub start: &'a dyn Fn() -> Result<Net>,
}

/// Something the campaign reports while it runs.
pub enum Event<'a> {
    Note(String),
    Step(&'a StepLog),
    Eval(&'a CurvePoint),
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
    let target = &s.lm.model;
    let taps = dart::stored_taps(target)?;
    let h = target.config.hidden_size;
    let source = TapSource::Online(OnlineTaps::new(target, &taps, 3 * h)?);
    let head = crate::train::dflash::frozen_head(target, s.vocab).map_err(cerr)?;
    let samples_path = s.dir.join("samples.bin");
    let (net, mut opt, mut pr) = match resume(s.dir, s.config, |w| on(Event::Note(w))) {
        Some((net, tensors, pr)) => {
            let mut opt = AdamW::new(&net.vars, 0.0).map_err(cerr)?;
            opt.load_state(&tensors, pr.step).map_err(cerr)?;
            on(Event::Note(format!(
                "resumed at step {} ({} positions, {:.2} CPU-hours)",
                pr.step,
                pr.positions,
                pr.cpu_s / 3600.0
            )));
            (net, opt, pr)
        }
        None => {
            let net = (s.start)()?;
            let opt = AdamW::new(&net.vars, 0.0).map_err(cerr)?;
            on(Event::Note(
                "no checkpoint: starting from the drafter".into(),
            ));
            (net, opt, Progress::default())
        }
    };
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
        let (mut samples, _) = read_samples(&samples_path)?;
        let n_distilled = samples.len();
        let held: HashSet<usize> = s.held_out.iter().copied().collect();
        let train: Vec<usize> = (0..n_distilled).filter(|i| !held.contains(i)).collect();
        samples.extend(s.corpus.iter().cloned());
        let data = run::Data {
            target,
            samples: &samples,
            features: &source,
            train: train.clone(),
            vocab: s.vocab,
            device: Device::Cpu,
            teacher_from: n_distilled,
        };
        if pr.step == 0 && read_curve(s.dir)?.is_empty() {
            evaluate(s, &data, &net, &mut pr, &now, &mut on)?;
        }
        // A round: at least one step, then until `round_s` has passed.
        let t_round = Instant::now();
        loop {
            if stop(&pr) {
                now(&mut pr);
                save(s.dir, &net, &opt, &pr)?;
                return Ok(pr);
            }
            let log = step(
                &net,
                &head,
                &data,
                &train,
                n_distilled,
                p,
                &mut opt,
                &mut pr,
            )?;
            append_line(&s.dir.join("train_log.jsonl"), &log)?;
            on(Event::Step(&log));
            if pr.step.is_multiple_of(p.eval_every.max(1)) {
                evaluate(s, &data, &net, &mut pr, &now, &mut on)?;
            }
            if t_round.elapsed().as_secs_f64() >= p.round_s {
                break;
            }
        }
        now(&mut pr);
        save(s.dir, &net, &opt, &pr)?;
        drop(data);
        if p.distill_share > 0.0 && prompts_left {
            let secs = p.round_s * p.distill_share / (1.0 - p.distill_share).max(0.05);
            let want = if distill_rate > 0.0 {
                (secs * distill_rate).round().max(1.0) as usize
            } else {
                p.gen_seqs.max(1) * 2
            };
            let t0 = Instant::now();
            let before = n_distilled;
            let got = distill(
                target,
                &s.lm.tokenizer,
                s.prompts,
                &samples_path,
                &DistillParams {
                    samples: before + want,
                    max_new_tokens: p.max_new_tokens,
                    max_prompt_tokens: 1024,
                    seqs: p.gen_seqs.max(1),
                    capture: None,
                },
                |_, _| {},
            )?;
            let dt = t0.elapsed().as_secs_f64();
            let added = got.len() - before;
            if added > 0 {
                distill_rate = added as f64 / dt.max(1e-3);
            } else {
                prompts_left = false;
            }
            on(Event::Note(format!(
                "self-distilled {added} samples in {dt:.0} s ({} in all)",
                got.len()
            )));
        }
    }
}

/// One optimiser step over `batch_seqs` sequences drawn (seeded by the step) from the
/// distilled training samples or, with probability `corpus_share`, the corpus.
#[allow(clippy::too_many_arguments)]
fn step(
    net: &Net,
    head: &crate::train::dflash::net::FrozenHead,
    data: &run::Data,
    train: &[usize],
    n_distilled: usize,
    p: &Params,
    opt: &mut AdamW,
    pr: &mut Progress,
) -> Result<StepLog> {
    let t0 = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(p.seed ^ (pr.step as u64).wrapping_mul(0x9e37_79b9));
    let n_corpus = data.samples.len() - n_distilled;
    let mut chunk = vec![];
    for _ in 0..p.batch_seqs.max(1) {
        let corpus = n_corpus > 0 && (rng.next_u64() as f64 / u64::MAX as f64) < p.corpus_share;
        chunk.push(if corpus || train.is_empty() {
            n_distilled + (rng.next_u64() % n_corpus.max(1) as u64) as usize
        } else {
            train[(rng.next_u64() % train.len() as u64) as usize]
        });
    }
    let masks = net.config.draft_length;
    let (mut total, mut wsum, mut hit, mut n1, mut rows) = (None::<Tensor>, 0f32, 0, 0, 0);
    for &si in &chunk {
        let anchors = dart::sample_prefixes(&data.samples[si], p.anchors, &mut rng);
        let Some(lb) = dart::build(data, si, &anchors, masks, p.gamma).map_err(cerr)? else {
            continue;
        };
        rows += lb.labels.len();
        let (l, w, h1, c1) = dart::sequence_loss(net, head, &lb, p.kl_weight).map_err(cerr)?;
        total = Some(match total {
            None => l,
            Some(t) => (t + l).map_err(cerr)?,
        });
        wsum += w;
        hit += h1;
        n1 += c1;
    }
    let warm = ((pr.step + 1) as f64 / p.warmup_steps.max(1) as f64).min(1.0);
    let lr = p.lr * warm;
    let (loss, gn) = match total {
        Some(t) if wsum > 0.0 => {
            let l = (t / wsum as f64).map_err(cerr)?;
            run::optimise(&net.vars, opt, &l, lr, p.grad_clip)?
        }
        _ => (0.0, 0.0),
    };
    pr.step += 1;
    pr.positions += rows as u64;
    Ok(StepLog {
        step: pr.step,
        loss,
        acc1: hit as f64 / n1.max(1) as f64,
        lr,
        grad_norm: gn,
        positions: rows,
        secs: t0.elapsed().as_secs_f64(),
    })
}

fn evaluate(
    s: &Setup,
    data: &run::Data,
    net: &Net,
    pr: &mut Progress,
    now: &impl Fn(&mut Progress),
    on: &mut impl FnMut(Event),
) -> Result<()> {
    let t0 = Instant::now();
    let e = dart::evaluate(net, data, &s.held_out, 32)?;
    now(pr);
    let point = CurvePoint {
        progress: pr.clone(),
        samples: data.teacher_from,
        eval: e,
    };
    append_line(&s.dir.join("curve.jsonl"), &point)?;
    on(Event::Note(format!(
        "held-out evaluation took {:.0} s",
        t0.elapsed().as_secs_f64()
    )));
    on(Event::Eval(&point));
    // The latest weights as a drafter, and the best so far by held-out α1.
    let best = read_curve(s.dir)?
        .iter()
        .map(|c| c.eval.alpha.first().copied().unwrap_or(0.0))
        .fold(0.0, f64::max);
    let a1 = point.eval.alpha.first().copied().unwrap_or(0.0);
    let mut dirs = vec![s.dir.join("latest")];
    if a1 >= best {
        dirs.push(s.dir.join("best"));
    }
    for d in dirs {
        let tmp = d.with_extension("tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        dart::export(net, s.vocab, &tmp, candle_core::DType::F16)?;
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

/// Where a campaign's data comes from.
pub struct Sources {
    /// The committed self-distilled samples (`samples.bin` format, `.gz` read compressed): the
    /// campaign's data starts as them, and their last 5 % are its held-out set (the split the
    /// published drafter was evaluated on).
    pub seed: PathBuf,
    /// The prompts their `prompt_index` refers to (and new samples are distilled from).
    pub prompts: PathBuf,
    /// Corpus files (`{"id", "text"}` JSON Lines) for teacher-forced text.
    pub corpus: Vec<PathBuf>,
    /// Longest corpus sequence in tokens.
    pub corpus_max_len: usize,
}

/// A campaign's data, ready for [`Setup`].
pub struct Prepared {
    pub prompts: Vec<Prompt>,
    pub held_out: Vec<usize>,
    pub corpus: Vec<Sample>,
}

/// Seeds `DIR/samples.bin` from the committed samples on first use (and checks it still starts
/// with them afterwards), fixes the held-out split, and tokenises the corpus once into
/// `DIR/corpus-*.bin`, leaving out records whose id is a held-out prompt.
pub fn prepare(
    dir: &Path,
    lm: &Loaded,
    src: &Sources,
    mut note: impl FnMut(String),
) -> Result<Prepared> {
    use crate::train::data::SampleWriter;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let seed_copy = dir.join("seed.bin");
    if !seed_copy.exists() {
        let mut bytes = vec![];
        let f = std::fs::File::open(&src.seed).map_err(|e| Error::io(&src.seed, e))?;
        use std::io::Read;
        if src.seed.extension().is_some_and(|e| e == "gz") {
            flate2::read::GzDecoder::new(f).read_to_end(&mut bytes)
        } else {
            std::io::BufReader::new(f).read_to_end(&mut bytes)
        }
        .map_err(|e| Error::io(&src.seed, e))?;
        write_atomic(&seed_copy, &bytes)?;
    }
    let (seed, _) = read_samples(&seed_copy)?;
    if seed.len() < 20 {
        return Err(bad(
            &src.seed,
            format!("{} samples: need at least 20", seed.len()),
        ));
    }
    let samples_path = dir.join("samples.bin");
    if !samples_path.exists() {
        std::fs::copy(&seed_copy, &samples_path).map_err(|e| Error::io(&samples_path, e))?;
    }
    let (have, _) = read_samples(&samples_path)?;
    if have.len() < seed.len() || have[..seed.len()] != seed[..] {
        return Err(bad(
            &samples_path,
            format!(
                "does not start with the {} seed samples of {}: move it away to start afresh",
                seed.len(),
                src.seed.display()
            ),
        ));
    }
    let prompts = crate::train::data::read_prompts(&src.prompts)?;
    if let Some(s) = have
        .iter()
        .find(|s| s.prompt_index as usize >= prompts.len())
    {
        return Err(bad(
            &src.prompts,
            format!(
                "a sample refers to prompt {} of {}",
                s.prompt_index,
                prompts.len()
            ),
        ));
    }
    let n = seed.len();
    let held_out: Vec<usize> = (n - n / 20..n).collect();
    let exclude: HashSet<String> = held_out
        .iter()
        .map(|&i| prompts[seed[i].prompt_index as usize].id.clone())
        .collect();
    let mut corpus = vec![];
    for path in &src.corpus {
        let len = std::fs::metadata(path)
            .map_err(|e| Error::io(path, e))?
            .len();
        let stem = path
            .file_name()
            .map_or("corpus".into(), |f| f.to_string_lossy().replace('.', "_"));
        let cache = dir.join(format!("corpus-{stem}-{len}-{}.bin", src.corpus_max_len));
        if !cache.exists() {
            let t0 = Instant::now();
            let got = corpus_samples(lm, path, &prompts, &exclude, src.corpus_max_len)?;
            let tmp = cache.with_extension("tmp");
            let _ = std::fs::remove_file(&tmp);
            let (mut w, _) = SampleWriter::open(&tmp)?;
            for s in &got {
                w.append(s)?;
            }
            drop(w);
            std::fs::rename(&tmp, &cache).map_err(|e| Error::io(&cache, e))?;
            note(format!(
                "tokenised {} into {} sequences in {:.0} s",
                path.display(),
                got.len(),
                t0.elapsed().as_secs_f64()
            ));
        }
        corpus.extend(read_samples(&cache)?.0);
    }
    let toks: usize = corpus.iter().map(|s| s.tokens.len()).sum();
    note(format!(
        "{} self-distilled samples ({} held out), {} corpus sequences ({toks} tokens)",
        have.len(),
        held_out.len(),
        corpus.len()
    ));
    Ok(Prepared {
        prompts,
        held_out,
        corpus,
    })
}

/// Training throughput: `steps` steps from the start drafter (nothing saved), in scored
/// positions per second and seconds per step, after one warm-up step.
pub fn bench(s: &Setup, p: &Params, steps: usize) -> Result<(f64, f64)> {
    let target = &s.lm.model;
    let taps = dart::stored_taps(target)?;
    let h = target.config.hidden_size;
    let source = TapSource::Online(OnlineTaps::new(target, &taps, 3 * h)?);
    let head = crate::train::dflash::frozen_head(target, s.vocab).map_err(cerr)?;
    let (mut samples, _) = read_samples(&s.dir.join("samples.bin"))?;
    let n = samples.len();
    let train: Vec<usize> = (0..n).filter(|i| !s.held_out.contains(i)).collect();
    samples.extend(s.corpus.iter().cloned());
    let data = run::Data {
        target,
        samples: &samples,
        features: &source,
        train: train.clone(),
        vocab: s.vocab,
        device: Device::Cpu,
        teacher_from: n,
    };
    let net = (s.start)()?;
    let mut opt = AdamW::new(&net.vars, 0.0).map_err(cerr)?;
    let mut pr = Progress::default();
    step(&net, &head, &data, &train, n, p, &mut opt, &mut pr)?;
    let (t0, pos0) = (Instant::now(), pr.positions);
    for _ in 0..steps.max(1) {
        step(&net, &head, &data, &train, n, p, &mut opt, &mut pr)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok((
        (pr.positions - pos0) as f64 / secs,
        secs / steps.max(1) as f64,
    ))
}
