//! A campaign's data: the committed self-distilled samples it starts from (their held-out
//! split) and corpus text, tokenised once into the campaign's directory.

use super::store::{bad, write_atomic};
use super::{Setup, Teacher};
use crate::error::{Error, Result};
use crate::model::{Loaded, Message};
use crate::train::data::{
    parse_samples, read_maybe_gz, read_samples, read_text_maybe_gz, Prompt, Sample,
};
use crate::train::run;
use candle_core::Device;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

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
    let text = read_text_maybe_gz(path)?;
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

/// Where a campaign's data comes from.
pub struct Sources {
    /// The committed self-distilled samples (`samples.bin` format, `.gz` read compressed): the
    /// campaign's data starts as them, and their last 5 % are its held-out set (the split the
    /// published drafter was evaluated on).
    pub seed: PathBuf,
    /// More committed self-distilled samples (the same format): answers earlier campaigns
    /// distilled, kept in the repository so that a campaign on a new machine starts with them.
    /// A new campaign's data gets them after the seed, leaving out samples of held-out prompts
    /// and of prompts already answered; an existing campaign's data is left as it is.
    pub more: Option<PathBuf>,
    /// Committed sampled answers (the same format; training prompts answered again at a
    /// temperature, e.g. on a lent GPU): a new campaign's `sampled.bin` starts as them, less
    /// those of held-out prompts.
    pub sampled: Option<PathBuf>,
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
        write_atomic(&seed_copy, &read_maybe_gz(&src.seed)?)?;
    }
    let (seed, _) = read_samples(&seed_copy)?;
    if seed.len() < 20 {
        return Err(bad(
            &src.seed,
            format!("{} samples: need at least 20", seed.len()),
        ));
    }
    let samples_path = dir.join("samples.bin");
    let fresh = !samples_path.exists();
    let staged = dir.join("samples.tmp");
    if fresh {
        std::fs::copy(&seed_copy, &staged).map_err(|e| Error::io(&staged, e))?;
    }
    let (mut have, _) = read_samples(if fresh { &staged } else { &samples_path })?;
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
    known_prompts(&have, prompts.len(), &src.prompts)?;
    let n = seed.len();
    let held_out: Vec<usize> = (n - n / 20..n).collect();
    let exclude: HashSet<String> = held_out
        .iter()
        .map(|&i| prompts[seed[i].prompt_index as usize].id.clone())
        .collect();
    if fresh {
        // The new campaign's data: the seed, then the committed answers it lacks. Written
        // aside and renamed, so that a failure here leaves no half-made data behind.
        if let Some(more) = &src.more {
            let (extra, _) = parse_samples(&read_maybe_gz(more)?, more)?;
            let mut answered: HashSet<u32> = have.iter().map(|s| s.prompt_index).collect();
            let (mut w, _) = SampleWriter::open(&staged)?;
            for s in extra {
                let Some(p) = prompts.get(s.prompt_index as usize) else {
                    continue;
                };
                if exclude.contains(&p.id) || !answered.insert(s.prompt_index) {
                    continue;
                }
                w.append(&s)?;
                have.push(s);
            }
            drop(w);
            note(format!(
                "{} committed samples from {} join the seed",
                have.len() - seed.len(),
                more.display()
            ));
        }
        if let Some(path) = &src.sampled {
            if let Some(n) = seed_sampled(dir, path, &prompts, &exclude)? {
                note(format!(
                    "{n} committed sampled answers from {}",
                    path.display()
                ));
            }
        }
        std::fs::rename(&staged, &samples_path).map_err(|e| Error::io(&samples_path, e))?;
    }
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
            write_samples_atomic(&cache, &got)?;
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

/// Writes `DIR/sampled.bin` from the committed sampled answers at `path`, leaving out answers to
/// prompts in `exclude` (the held-out ones); returns how many were written, or `None` when the
/// directory already has sampled answers (they are kept).
fn seed_sampled(
    dir: &Path,
    path: &Path,
    prompts: &[Prompt],
    exclude: &HashSet<String>,
) -> Result<Option<usize>> {
    let out = dir.join("sampled.bin");
    if out.exists() {
        return Ok(None);
    }
    let (mut keep, _) = parse_samples(&read_maybe_gz(path)?, path)?;
    known_prompts(&keep, prompts.len(), path)?;
    keep.retain(|s| !exclude.contains(&prompts[s.prompt_index as usize].id));
    write_samples_atomic(&out, &keep)?;
    Ok(Some(keep.len()))
}

/// Refuses samples (read from `path`) that answer a prompt beyond the `n` prompts there are.
fn known_prompts(samples: &[Sample], n: usize, path: &Path) -> Result<()> {
    match samples.iter().find(|s| s.prompt_index as usize >= n) {
        Some(s) => Err(bad(
            path,
            format!("a sample refers to prompt {} of {n}", s.prompt_index),
        )),
        None => Ok(()),
    }
}

/// Writes `samples` as a new token file at `path`: staged beside it (`.tmp`) and renamed, so
/// that a failure leaves no half-written file under the final name.
fn write_samples_atomic(path: &Path, samples: &[Sample]) -> Result<()> {
    use crate::train::data::SampleWriter;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let (mut w, _) = SampleWriter::open(&tmp)?;
    for s in samples {
        w.append(s)?;
    }
    drop(w);
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// The campaign's data as it stands: the greedy self-distilled samples on disk, the sampled
/// ones, then the corpus.
pub(super) struct Snapshot {
    pub samples: Vec<Sample>,
    pub pools: Pools,
}

/// Where each kind of sequence lies in a [`Snapshot`]'s samples.
pub(super) struct Pools {
    /// Greedy samples, the held-out ones included (they come first).
    pub n_greedy: usize,
    /// The greedy training split.
    pub greedy: Vec<usize>,
    pub sampled: std::ops::Range<usize>,
    pub corpus: std::ops::Range<usize>,
    /// Prompts of the greedy training split (sorted): what sampled distillation answers again.
    pub train_prompts: Vec<usize>,
}

impl Pools {
    /// The next `n` (prompt, seed) pairs for sampled distillation: passes over the training
    /// prompts, each pass in its own seeded order with its own seeds, continuing after the
    /// samples already drawn.
    pub fn next_sampled(&self, n: usize, seed: u64) -> Vec<(usize, u64)> {
        let m = self.train_prompts.len();
        if m == 0 {
            return vec![];
        }
        let mut perm = (usize::MAX, vec![]);
        (self.sampled.len()..self.sampled.len() + n)
            .map(|k| {
                let pass = k / m;
                if perm.0 != pass {
                    let mut order = self.train_prompts.clone();
                    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5a4d_0000 ^ pass as u64);
                    for i in (1..m).rev() {
                        order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
                    }
                    perm = (pass, order);
                }
                let prompt = perm.1[k % m];
                let s =
                    seed ^ ((pass as u64 + 1) << 40) ^ (prompt as u64).wrapping_mul(0x9e37_79b9);
                (prompt, s)
            })
            .collect()
    }
}

impl Snapshot {
    pub fn read(s: &Setup) -> Result<Self> {
        let (mut samples, _) = read_samples(&s.dir.join("samples.bin"))?;
        let n_greedy = samples.len();
        let sampled_path = s.dir.join("sampled.bin");
        if sampled_path.exists() {
            let (sampled, _) = read_samples(&sampled_path)?;
            if let Some(x) = sampled
                .iter()
                .find(|x| x.prompt_index as usize >= s.prompts.len())
            {
                return Err(bad(
                    &sampled_path,
                    format!(
                        "a sample refers to prompt {} of {}",
                        x.prompt_index,
                        s.prompts.len()
                    ),
                ));
            }
            samples.extend(sampled);
        }
        let n_self = samples.len();
        samples.extend(s.corpus.iter().cloned());
        let held: HashSet<usize> = s.held_out.iter().copied().collect();
        let greedy: Vec<usize> = (0..n_greedy).filter(|i| !held.contains(i)).collect();
        let mut train_prompts: Vec<usize> = greedy
            .iter()
            .map(|&i| samples[i].prompt_index as usize)
            .collect();
        train_prompts.sort_unstable();
        train_prompts.dedup();
        let pools = Pools {
            n_greedy,
            greedy,
            sampled: n_greedy..n_self,
            corpus: n_self..samples.len(),
            train_prompts,
        };
        Ok(Snapshot { samples, pools })
    }

    /// The trainer's view: the greedy samples minus the held-out ones and the sampled ones are
    /// the training split; sampled text and the corpus are teacher-forced.
    pub fn data<'a>(&'a self, s: &'a Setup, t: &'a Teacher) -> run::Data<'a> {
        run::Data {
            target: &s.lm.model,
            samples: &self.samples,
            features: &t.source,
            train: self
                .pools
                .greedy
                .iter()
                .copied()
                .chain(self.pools.sampled.clone())
                .collect(),
            vocab: s.vocab,
            device: Device::Cpu,
            teacher_from: self.pools.n_greedy,
        }
    }
}
