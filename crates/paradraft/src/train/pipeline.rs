//! The training pipeline every drafter shares: self-distillation data → (cached target features)
//! → training → export → held-out evaluation, each stage resumable from what the working
//! directory holds. The objectives plug in their own training step (`dflash::pipeline`,
//! `dart::pipeline`, `pard::pipeline`); this file holds what they share: the data spec, the
//! split and draft vocabulary, the feature cache, the mask token, progress and the written
//! records.

use super::data::{distill, read_prompts, DistillParams, Sample};
use super::features;
use crate::drafters::vocab::DraftVocab;
use crate::error::{Error, Result};
use crate::model::{Loaded, Model};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// The stage a run stops after.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Stage {
    Data,
    Features,
    Train,
    Eval,
}

/// What every trainer's data stage takes (also the `paradraft train` flags: the CLI flattens
/// it, with the target's own flags, into each trainer's).
#[derive(Clone, Debug, clap::Args)]
pub struct DataSpec {
    /// Working directory: samples.bin, features, checkpoints, log, and the exported drafter.
    #[arg(long)]
    pub out: PathBuf,
    /// Training prompts (JSON Lines with "id" and "prompt"; `.gz` is read compressed).
    #[arg(long, default_value = "data/train/distill_prompts.jsonl.gz")]
    pub prompts: PathBuf,
    /// Sequences self-distilled at once (continuous batching; 1 is single-stream).
    #[arg(long, default_value_t = 16)]
    pub gen_seqs: usize,
    /// Self-distilled samples to generate (held-out evaluation takes the last 5 %).
    #[arg(long, default_value_t = 1000)]
    pub samples: usize,
    /// Longest target response per sample.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Stop after this stage.
    #[arg(long, value_enum)]
    pub until: Option<Stage>,
    /// Reduced draft vocabulary: the N most frequent response tokens (0: the full vocabulary).
    #[arg(long, default_value_t = 8192)]
    pub draft_vocab: usize,
    /// Prompts (JSON Lines with "prompt") to leave out of the held-out evaluation, e.g. the
    /// prompts a drafter given to --init-from or --evaluate was trained on.
    #[arg(long)]
    pub eval_exclude: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where the drafter trains: cpu, cuda or cuda:N (a CUDA device needs a `--features cuda`
    /// build); batches and target features are made on the CPU and copied there.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// The target's name in plot titles (set by the caller).
    #[arg(skip)]
    pub target_name: String,
}

impl DataSpec {
    /// Whether the run stops after `stage`.
    pub fn stops_after(&self, stage: Stage) -> bool {
        self.until == Some(stage)
    }
}

/// The self-distilled data of a run, its split and its draft vocabulary.
pub struct Prepared {
    pub lm: Loaded,
    pub samples: Vec<Sample>,
    pub train_idx: Vec<usize>,
    pub eval_idx: Vec<usize>,
    pub vocab: DraftVocab,
    /// The target layers whose outputs the feature cache stores.
    pub stored: Vec<usize>,
}

/// A progress bar for `total` items of `what`.
pub fn bar(total: usize, what: &str) -> ProgressBar {
    let b = ProgressBar::new(total as u64);
    b.set_style(
        ProgressStyle::with_template(&format!(
            "{what} {{bar:40}} {{pos}}/{{len}} [{{elapsed_precise}} < {{eta_precise}}]"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    b
}

/// Self-distillation with `lm` (capturing the `stored` taps as it generates), the held-out
/// split (the last 5 %, minus `eval_exclude` prompts) and the draft vocabulary. `None` when
/// the run stops after the data.
pub fn prepare(lm: Loaded, spec: &DataSpec, stored: Vec<usize>) -> Result<Option<Prepared>> {
    std::fs::create_dir_all(&spec.out).map_err(|e| Error::io(&spec.out, e))?;
    let prompts = read_prompts(&spec.prompts)?;
    let tc = &lm.model.config;
    if let Some(&t) = stored.iter().find(|&&t| t >= tc.n_layers) {
        return Err(Error::BadRequest(format!(
            "target layer {t} does not exist ({} layers)",
            tc.n_layers
        )));
    }
    let pb = bar(spec.samples, "self-distillation");
    let t0 = std::time::Instant::now();
    let mut first = None;
    let samples_path = spec.out.join("samples.bin");
    let samples = distill(
        &lm.model,
        &lm.tokenizer,
        &prompts,
        &samples_path,
        &DistillParams {
            samples: spec.samples,
            max_new_tokens: spec.max_new_tokens,
            max_prompt_tokens: 1024,
            seqs: spec.gen_seqs.max(1),
            // The drafter's features come with the generation (no second target pass).
            capture: (!stored.is_empty())
                .then(|| (stored.clone(), features::cache_path(&spec.out, &stored))),
        },
        |d, _| {
            first.get_or_insert(d);
            pb.set_position(d as u64)
        },
        || false,
    )?;
    pb.finish();
    if samples.len() < 2 {
        return Err(Error::BadRequest(format!(
            "{} training sample(s) in {}: need at least 2 (one is held out); check --prompts {}",
            samples.len(),
            samples_path.display(),
            spec.prompts.display()
        )));
    }
    report_distillation(&samples, first, t0.elapsed().as_secs_f64(), spec.gen_seqs);
    if spec.stops_after(Stage::Data) {
        return Ok(None);
    }
    // Held-out split: the last 5 % of the samples (at least one).
    let n_eval = (samples.len() / 20)
        .max(1)
        .min(samples.len().saturating_sub(1));
    let train_idx: Vec<usize> = (0..samples.len() - n_eval).collect();
    let mut eval_idx: Vec<usize> = (samples.len() - n_eval..samples.len()).collect();
    if let Some(path) = &spec.eval_exclude {
        let seen: std::collections::HashSet<String> =
            read_prompts(path)?.into_iter().map(|p| p.prompt).collect();
        let before = eval_idx.len();
        eval_idx.retain(|&i| {
            prompts
                .get(samples[i].prompt_index as usize)
                .is_none_or(|p| !seen.contains(&p.prompt))
        });
        eprintln!(
            "held-out: {} of {before} samples kept ({} prompts appear in {})",
            eval_idx.len(),
            before - eval_idx.len(),
            path.display()
        );
        if eval_idx.is_empty() {
            return Err(Error::BadRequest(format!(
                "every held-out prompt appears in {}",
                path.display()
            )));
        }
    }
    let vocab = if spec.draft_vocab == 0 || spec.draft_vocab >= tc.vocab_size {
        DraftVocab::full(tc.vocab_size)
    } else {
        let train_samples: Vec<_> = train_idx.iter().map(|&i| samples[i].clone()).collect();
        DraftVocab::most_frequent(&train_samples, tc.vocab_size, spec.draft_vocab)
    };
    let held: Vec<_> = eval_idx.iter().map(|&i| samples[i].clone()).collect();
    eprintln!(
        "draft vocabulary {} tokens, covering {:.2} % of held-out response tokens",
        vocab.len(),
        100.0 * vocab.coverage(&held)
    );
    Ok(Some(Prepared {
        lm,
        samples,
        train_idx,
        eval_idx,
        vocab,
        stored,
    }))
}

/// The generation speed of the samples made now (from index `first`), and the totals.
fn report_distillation(samples: &[Sample], first: Option<usize>, secs: f64, seqs: usize) {
    let new = &samples[first.unwrap_or(0).min(samples.len())..];
    if !new.is_empty() {
        let resp: usize = new
            .iter()
            .map(|s| s.tokens.len() - s.prompt_len as usize)
            .sum();
        let all: usize = new.iter().map(|s| s.tokens.len()).sum();
        eprintln!(
            "self-distilled {} samples in {secs:.1} s: {:.1} response tokens/s ({:.1} tokens/s with prompts), {} sequences at once",
            new.len(),
            resp as f64 / secs,
            all as f64 / secs,
            seqs.max(1)
        );
    }
    let toks: usize = samples.iter().map(|s| s.tokens.len()).sum();
    eprintln!("{} samples, {toks} tokens", samples.len());
}

impl Prepared {
    /// The feature cache of the stored taps (computed where missing); its first `ctx_width`
    /// floats per row are the drafter's context.
    pub fn feature_cache(&self, out: &Path, ctx_width: usize) -> Result<features::TapSource> {
        let fpath = features::cache_path(out, &self.stored);
        let pb = bar(self.samples.len(), "target features");
        let feats = features::build(
            &self.lm.model,
            &self.samples,
            &self.stored,
            &fpath,
            |d, _| pb.set_position(d as u64),
        )?
        .with_context_width(ctx_width);
        pb.finish();
        Ok(feats.into())
    }

    /// A frozen embedding row for mask slots: the lowest id the target never sees in this data
    /// and never emits to end a turn (SmolLM2: a rare special token).
    pub fn unused_token(&self) -> u32 {
        let n = self.lm.model.config.vocab_size;
        let mut seen = vec![false; n];
        let tok = &self.lm.tokenizer;
        for t in tok.stop_tokens.iter().chain(tok.bos.iter()) {
            seen[t.idx()] = true;
        }
        for s in &self.samples {
            for t in &s.tokens {
                seen[t.idx()] = true;
            }
        }
        seen.iter().position(|&x| !x).unwrap_or(n - 1) as u32
    }

    /// The mask token: `asked` (checked against the vocabulary and a drafter's own `fixed`
    /// one), else `fixed`, else [`Prepared::unused_token`].
    pub fn mask_token(&self, asked: Option<u32>, fixed: Option<u32>) -> Result<u32> {
        let n = self.lm.model.config.vocab_size;
        match (asked, fixed) {
            (Some(m), _) if m as usize >= n => Err(Error::BadRequest(format!(
                "--mask-token-id {m} is outside the vocabulary"
            ))),
            (Some(m), Some(f)) if m != f => Err(Error::BadRequest(format!(
                "--mask-token-id {m} differs from the drafter's ({f})"
            ))),
            (Some(m), _) | (None, Some(m)) => Ok(m),
            (None, None) => Ok(self.unused_token()),
        }
    }

    pub fn target(&self) -> &Model {
        &self.lm.model
    }

    /// The training set of a feature-conditioned drafter (DFlash, DART): the training split
    /// of these samples with `features`, on `device`.
    pub fn data<'a>(
        &'a self,
        features: &'a features::TapSource,
        device: candle_core::Device,
    ) -> super::run::Data<'a> {
        super::run::Data {
            target: &self.lm.model,
            samples: &self.samples,
            features,
            train: self.train_idx.clone(),
            vocab: &self.vocab,
            device,
            teacher_from: self.samples.len(),
        }
    }
}

/// `v` as pretty JSON at `path`.
pub fn write_json(path: &Path, v: &impl Serialize) -> Result<()> {
    let s = serde_json::to_string_pretty(v)
        .map_err(|e| Error::BadRequest(format!("{}: {e}", path.display())))?;
    std::fs::write(path, s).map_err(|e| Error::io(path, e))
}

/// The loss curve of the run logged in `dir` (`train_log.jsonl` → `loss.svg`).
pub fn plot_loss(dir: &Path, title: &str) -> Result<()> {
    let log = super::plot::read_log(&dir.join("train_log.jsonl"))?;
    super::plot::loss_svg(&log, title, &dir.join("loss.svg"))
}

/// Prints every tenth training step (and the first).
pub fn print_step(l: &super::run::LogLine) {
    if l.step.is_multiple_of(10) || l.step == 1 {
        eprintln!(
            "step {} epoch {} loss {:.4} acc1 {:.3} lr {:.2e} |g| {:.2} {:.2}s/step elapsed {:.0}s",
            l.step, l.epoch, l.loss, l.acc1, l.lr, l.grad_norm, l.secs, l.elapsed_s
        );
    }
}

/// Keeps freed training tensors in the heap for reuse: glibc otherwise maps and unmaps every
/// large tensor, and the kernel zeroes fresh pages on each step (about 13 % of a DFlash
/// training step's time in `perf`; +4 %, +19 % and +30 % positions/s in three interleaved
/// `train dflash --bench` pairs on a noisy VM). Call before any training tensor exists.
pub fn keep_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator thresholds; called before any training tensor.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_TOP_PAD, 256 << 20);
    }
}
