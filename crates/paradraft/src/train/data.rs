//! Self-distillation data (DFlash §4.1 / docs/dflash.md): the target answers the training prompts
//! greedily, many at once through continuous batching (`crate::batch`: one multi-sequence
//! forward per step, token-identical to single-stream greedy generation), and each
//! chat-templated sample is stored as compact token records. Loss applies to the response only.
//!
//! File format (`samples.bin`): the magic `PDTK0001`, then records of little-endian u32s:
//! `[prompt_index, prompt_len, n, token × n]`. Appending is resumable: a torn last record is cut
//! off when the file is reopened.

use crate::batch::{generate_batched, Request};
use crate::error::{Error, Result};
use crate::model::{Message, Model, Tokenizer};
use crate::sample::SamplingParams;
use crate::train::features::FeatureAppender;
use crate::types::TokenId;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::Path;

const MAGIC: &[u8; 8] = b"PDTK0001";

pub use crate::types::Sample;

fn bad(path: &Path, reason: String) -> Error {
    Error::BadModelFile {
        path: path.to_path_buf(),
        format: "paradraft token",
        reason,
    }
}

/// Reads every complete record; also returns the byte length they span (to cut a torn tail).
pub fn read_samples(path: &Path) -> Result<(Vec<Sample>, usize)> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| Error::io(path, e))?;
    parse_samples(&bytes, path)
}

/// [`read_samples`] of bytes already read (`path` names them in errors).
pub fn parse_samples(bytes: &[u8], path: &Path) -> Result<(Vec<Sample>, usize)> {
    if bytes.len() < 8 || &bytes[..8] != MAGIC {
        return Err(bad(path, "missing PDTK0001 header".into()));
    }
    let word = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
    let (mut at, mut out) = (8, Vec::new());
    while at + 12 <= bytes.len() {
        let n = word(at + 8) as usize;
        let end = at + 12 + 4 * n;
        if end > bytes.len() {
            break;
        }
        let (pi, pl) = (word(at), word(at + 4));
        if pl as usize > n {
            return Err(bad(
                path,
                format!("record at byte {at}: prompt longer than sample"),
            ));
        }
        let tokens = (0..n).map(|i| TokenId(word(at + 12 + 4 * i))).collect();
        out.push(Sample {
            prompt_index: pi,
            prompt_len: pl,
            tokens,
        });
        at = end;
    }
    Ok((out, at))
}

/// Appends records to a token file, creating it or cutting a torn tail first.
pub struct SampleWriter {
    file: std::fs::File,
    path: std::path::PathBuf,
}

impl SampleWriter {
    /// Opens `path` for appending; returns the writer and the samples already there.
    pub fn open(path: &Path) -> Result<(Self, Vec<Sample>)> {
        let io = |e| Error::io(path, e);
        let existing = if path.exists() {
            let (s, valid) = read_samples(path)?;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(io)?;
            f.set_len(valid as u64).map_err(io)?;
            s
        } else {
            std::fs::write(path, MAGIC).map_err(io)?;
            vec![]
        };
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(io)?;
        Ok((
            SampleWriter {
                file,
                path: path.to_path_buf(),
            },
            existing,
        ))
    }

    pub fn append(&mut self, s: &Sample) -> Result<()> {
        let mut buf = Vec::with_capacity(12 + 4 * s.tokens.len());
        for w in [s.prompt_index, s.prompt_len, s.tokens.len() as u32] {
            buf.extend_from_slice(&w.to_le_bytes());
        }
        for t in &s.tokens {
            buf.extend_from_slice(&t.0.to_le_bytes());
        }
        self.file
            .write_all(&buf)
            .and_then(|_| self.file.flush())
            .map_err(|e| Error::io(&self.path, e))
    }
}

/// A training prompt as vendored in `data/train/*.jsonl` (`{"id", "source", "category", "prompt"}`).
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Prompt {
    pub id: String,
    #[serde(default)]
    pub category: String,
    pub prompt: String,
}

/// [`read_maybe_gz`] of a UTF-8 text file.
pub fn read_text_maybe_gz(path: &Path) -> Result<String> {
    String::from_utf8(read_maybe_gz(path)?).map_err(|e| {
        Error::io(
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()),
        )
    })
}

/// A file's bytes, decompressed when its name ends in `.gz`.
pub fn read_maybe_gz(path: &Path) -> Result<Vec<u8>> {
    let mut bytes = vec![];
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    if path.extension().is_some_and(|e| e == "gz") {
        flate2::read::GzDecoder::new(f).read_to_end(&mut bytes)
    } else {
        std::io::BufReader::new(f).read_to_end(&mut bytes)
    }
    .map_err(|e| Error::io(path, e))?;
    Ok(bytes)
}

/// Reads a prompt file: JSON Lines, gzip-compressed when the name ends in `.gz`.
pub fn read_prompts(path: &Path) -> Result<Vec<Prompt>> {
    read_text_maybe_gz(path)?
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| {
                bad(
                    path,
                    format!("line {}: {e} (want {{\"id\", \"prompt\"}})", i + 1),
                )
            })
        })
        .collect()
}

/// Settings of the self-distillation run.
#[derive(Clone, Debug)]
pub struct DistillParams {
    /// Samples wanted in the file (prompts beyond are not used).
    pub samples: usize,
    pub max_new_tokens: usize,
    /// Longest prompt kept (longer prompts are skipped).
    pub max_prompt_tokens: usize,
    /// Sequences generated at once (continuous batching).
    pub seqs: usize,
    /// Target layers whose outputs are captured while generating, and the feature cache they
    /// are appended to (see [`crate::train::features`]); nothing is captured when `None`.
    pub capture: Option<(Vec<usize>, std::path::PathBuf)>,
}

/// Generates responses for prompts not yet in `out` until it holds `p.samples` records.
/// Samples are appended as they finish, so the file's order is finishing order; a rerun
/// skips the prompts already answered. `progress(done, total)` is called after each sample;
/// `stop()` before each new prompt is taken on: once it says so, no prompt is started and the
/// answers under way finish (so a stop waits for at most one batch).
pub fn distill(
    model: &Model,
    tok: &Tokenizer,
    prompts: &[Prompt],
    out: &Path,
    p: &DistillParams,
    mut progress: impl FnMut(usize, usize),
    mut stop: impl FnMut() -> bool,
) -> Result<Vec<Sample>> {
    let (mut w, mut have) = SampleWriter::open(out)?;
    let done: HashSet<u32> = have.iter().map(|s| s.prompt_index).collect();
    progress(have.len(), p.samples);
    let want = p.samples.saturating_sub(have.len());
    if want == 0 {
        return Ok(have);
    }
    // Requests are made lazily, so only the prompts that get used are tokenized.
    let mut err = None;
    let reqs = prompts
        .iter()
        .enumerate()
        .filter(|(i, _)| !done.contains(&(*i as u32)))
        .filter_map(|(i, pr)| {
            let ids = tok.encode_chat(&[Message::new("user", &pr.prompt)], true);
            match ids {
                Ok(ids) if ids.len() <= p.max_prompt_tokens => Some(Request {
                    id: i as u64,
                    prompt: ids,
                    max_new_tokens: p.max_new_tokens,
                    sampling: SamplingParams::default(),
                }),
                Ok(_) => None,
                Err(e) => {
                    err.get_or_insert(e);
                    None
                }
            }
        })
        .take(want)
        .take_while(|_| !stop());
    let ctx = p.max_prompt_tokens + p.max_new_tokens + 1;
    let mut feats = match &p.capture {
        Some((taps, path)) => {
            let width = taps.len() * model.config.hidden_size;
            FeatureAppender::open(path, &have, width)?.map(|f| (taps.as_slice(), f))
        }
        None => None,
    };
    let taps = feats.as_ref().map_or(&[][..], |f| f.0);
    generate_batched(model, tok, taps, reqs, p.seqs, ctx, |f| {
        let mut tokens = f.prompt;
        let prompt_len = tokens.len() as u32;
        tokens.extend_from_slice(&f.tokens);
        // Features first: a run killed in between leaves rows the feature stage cuts off.
        if let Some((_, fa)) = feats.as_mut() {
            fa.append(tokens.len(), &f.features)?;
        }
        let s = Sample {
            prompt_index: f.id as u32,
            prompt_len,
            tokens,
        };
        w.append(&s)?;
        have.push(s);
        progress(have.len(), p.samples);
        Ok(())
    })?;
    match err {
        Some(e) => Err(e),
        None => Ok(have),
    }
}

/// Sampled answers for self-distillation beyond the prompts: for each `(prompt index, seed)` of
/// `which`, the target answers the prompt at `temperature` from that seed (a prompt may come
/// many times with different seeds), and the samples are appended to `out` as they finish
/// (prompts longer than `p.max_prompt_tokens` are skipped). Their tokens are not the target's
/// argmax, so a trainer labels them as teacher-forced text. Returns how many were appended.
/// `stop()` is asked before each new request, as in [`distill`].
#[allow(clippy::too_many_arguments)]
pub fn distill_sampled(
    model: &Model,
    tok: &Tokenizer,
    prompts: &[Prompt],
    which: &[(usize, u64)],
    temperature: f32,
    out: &Path,
    p: &DistillParams,
    mut stop: impl FnMut() -> bool,
) -> Result<usize> {
    if !(temperature > 0.0 && temperature.is_finite()) {
        return Err(Error::BadRequest(format!(
            "sampled self-distillation needs a temperature > 0 (got {temperature})"
        )));
    }
    let (mut w, _) = SampleWriter::open(out)?;
    let mut err = None;
    let reqs = which
        .iter()
        .filter_map(|&(i, seed)| {
            let pr = prompts.get(i)?;
            match tok.encode_chat(&[Message::new("user", &pr.prompt)], true) {
                Ok(ids) if ids.len() <= p.max_prompt_tokens => Some(Request {
                    id: i as u64,
                    prompt: ids,
                    max_new_tokens: p.max_new_tokens,
                    sampling: SamplingParams {
                        temperature,
                        seed,
                        ..Default::default()
                    },
                }),
                Ok(_) => None,
                Err(e) => {
                    err.get_or_insert(e);
                    None
                }
            }
        })
        .take_while(|_| !stop());
    let ctx = p.max_prompt_tokens + p.max_new_tokens + 1;
    let mut added = 0;
    generate_batched(model, tok, &[], reqs, p.seqs, ctx, |f| {
        let mut tokens = f.prompt;
        let prompt_len = tokens.len() as u32;
        tokens.extend_from_slice(&f.tokens);
        added += 1;
        w.append(&Sample {
            prompt_index: f.id as u32,
            prompt_len,
            tokens,
        })
    })?;
    match err {
        Some(e) => Err(e),
        None => Ok(added),
    }
}
