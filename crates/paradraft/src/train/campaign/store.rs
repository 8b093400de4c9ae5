//! What a campaign keeps on disk: its stamp (`campaign.json`), rotating checkpoints, the step
//! log and the held-out curve; every write atomic, every read of a broken file reported.

use super::student::{Shape, Student};
use super::Params;
use crate::drafters::vocab::DraftVocab;
use crate::error::{Error, Result};
use crate::model::Loaded;
use crate::train::optim::AdamW;
use crate::train::run::{self, Eval};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

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
    pub fn new(lm: &Loaded, shape: &Shape, vocab: &DraftVocab) -> Self {
        let c = &lm.model.config;
        Stamp {
            target_layers: c.n_layers,
            target_hidden: c.hidden_size,
            target_vocab: c.vocab_size,
            tokenizer_fingerprint: format!("{:016x}", lm.tokenizer.fingerprint()),
            draft_vocab_fingerprint: format!("{:016x}", fnv(&vocab.d2t)),
            drafter: shape.to_json(),
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

impl std::fmt::Display for Progress {
    /// `step 3000 (6162297 positions, 5.33 CPU-hours)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let h = self.cpu_s / 3600.0;
        write!(
            f,
            "step {} ({} positions, {h:.2} CPU-hours)",
            self.step, self.positions
        )
    }
}

/// One line of `curve.jsonl`: a held-out evaluation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CurvePoint {
    #[serde(flatten)]
    pub progress: Progress,
    /// Greedy self-distilled samples in the data (the held-out ones included).
    pub samples: usize,
    /// Sampled (teacher-labelled) self-distilled samples in the data.
    #[serde(default)]
    pub sampled: usize,
    /// The learning rate the weights were last trained at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
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

pub(super) fn bad(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::BadModelFile {
        path: path.to_path_buf(),
        format: "campaign",
        reason: e.to_string(),
    }
}

pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
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
pub fn save(
    dir: &Path,
    net: &Student,
    opt: &AdamW,
    ema: &HashMap<String, Tensor>,
    pr: &Progress,
) -> Result<()> {
    let root = dir.join("ckpt");
    let tmp = root.join(format!("step-{:08}.tmp", pr.step));
    let _ = std::fs::remove_dir_all(&tmp);
    run::save_checkpoint(&tmp, net.vars(), opt, pr.step, pr.wall_s)?;
    let ep = tmp.join("ema.safetensors");
    candle_core::safetensors::save(ema, &ep).map_err(|e| bad(&ep, e))?;
    write_atomic(
        &tmp.join("progress.json"),
        serde_json::to_string(pr).expect("json").as_bytes(),
    )?;
    load_one(&tmp, &net.shape())?;
    let done = root.join(format!("step-{:08}", pr.step));
    let _ = std::fs::remove_dir_all(&done);
    std::fs::rename(&tmp, &done).map_err(|e| Error::io(&done, e))?;
    for (_, old) in checkpoints(dir).into_iter().skip(2) {
        let _ = std::fs::remove_dir_all(old);
    }
    Ok(())
}

/// A checkpoint: the network, every saved tensor (for the optimiser), the progress and the
/// weights' moving average (absent in checkpoints written before it was kept).
type Restored = (
    Student,
    HashMap<String, Tensor>,
    Progress,
    Option<HashMap<String, Tensor>>,
);

fn load_one(ck: &Path, shape: &Shape) -> Result<Restored> {
    let saved = run::load_checkpoint(ck)?.ok_or_else(|| bad(ck, "no state.safetensors"))?;
    let pp = ck.join("progress.json");
    let text = std::fs::read_to_string(&pp).map_err(|e| Error::io(&pp, e))?;
    let pr: Progress = serde_json::from_str(&text).map_err(|e| bad(&pp, e))?;
    if pr.step != saved.step {
        return Err(bad(ck, "progress.json and state.json disagree on the step"));
    }
    let net = shape
        .net(&saved.tensors)
        .map_err(|e| run::broken_checkpoint(ck, e))?;
    let ep = ck.join("ema.safetensors");
    let ema = if ep.exists() {
        let t = candle_core::safetensors::load(&ep, &candle_core::Device::Cpu)
            .map_err(|e| bad(&ep, e))?;
        shape.net(&t).map_err(|e| bad(&ep, e))?;
        Some(t)
    } else {
        None
    };
    Ok((net, saved.tensors, pr, ema))
}

/// The newest checkpoint that loads (broken ones are reported through `warn` and skipped).
pub fn resume(dir: &Path, shape: &Shape, mut warn: impl FnMut(String)) -> Option<Restored> {
    for (_, ck) in checkpoints(dir) {
        if ck.extension().is_some_and(|e| e == "tmp") {
            continue;
        }
        match load_one(&ck, shape) {
            Ok(r) => return Some(r),
            Err(e) => warn(format!("skipping checkpoint {}: {e}", ck.display())),
        }
    }
    None
}

/// Drops lines of a JSONL log whose `step` lies past `step` (written after the checkpoint a
/// run resumes from).
pub(super) fn cut_log(path: &Path, step: usize) -> Result<()> {
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

pub(super) fn append_line(path: &Path, v: &impl Serialize) -> Result<()> {
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
