//! Self-distillation data (DFlash §4.1 / spec §3.3): the target answers the training prompts
//! with the engine's fastest lossless generation (greedy, prompt-lookup speculation), and each
//! chat-templated sample is stored as compact token records. Loss applies to the response only.
//!
//! File format (`samples.bin`): the magic `PDTK0001`, then records of little-endian u32s:
//! `[prompt_index, prompt_len, n, token × n]`. Appending is resumable: a torn last record is cut
//! off when the file is reopened.

use crate::drafters::pld::PromptLookup;
use crate::error::{Error, Result};
use crate::generate::GenerateParams;
use crate::kv::KvCache;
use crate::model::{Message, Model, Tokenizer};
use crate::sample::SamplingParams;
use crate::spec::{speculative_generate, Speculation};
use crate::types::TokenId;
use std::io::{Read, Write};
use std::path::Path;

const MAGIC: &[u8; 8] = b"PDTK0001";

/// One training sequence: prompt (chat template applied) then the target's response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Index of its prompt in the prompt file.
    pub prompt_index: u32,
    /// Tokens before the response; the loss covers `tokens[prompt_len..]`.
    pub prompt_len: u32,
    pub tokens: Vec<TokenId>,
}

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

pub fn read_prompts(path: &Path) -> Result<Vec<Prompt>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    text.lines()
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
}

/// Generates responses for prompts not yet in `out` until it holds `p.samples` records.
/// `progress(done, total)` is called after each sample.
pub fn distill(
    model: &Model,
    tok: &Tokenizer,
    prompts: &[Prompt],
    out: &Path,
    p: &DistillParams,
    mut progress: impl FnMut(usize, usize),
) -> Result<Vec<Sample>> {
    let (mut w, mut have) = SampleWriter::open(out)?;
    let next = have.last().map_or(0, |s| s.prompt_index as usize + 1);
    let mut kv = KvCache::new(
        model.config.n_layers,
        model.config.n_kv_heads,
        model.config.head_dim,
        p.max_prompt_tokens + p.max_new_tokens + 1,
    );
    let params = GenerateParams {
        max_new_tokens: p.max_new_tokens,
        sampling: SamplingParams::default(),
        stop_strings: vec![],
    };
    progress(have.len(), p.samples);
    for (i, pr) in prompts.iter().enumerate().skip(next) {
        if have.len() >= p.samples {
            break;
        }
        let text = tok.apply_chat_template(&[Message::new("user", &pr.prompt)], true)?;
        let prompt = tok.encode(&text)?;
        if prompt.len() > p.max_prompt_tokens {
            continue;
        }
        let mut pld = PromptLookup::default();
        let g = speculative_generate(
            model,
            tok,
            &mut kv,
            &prompt,
            &params,
            Speculation {
                drafter: &mut pld,
                max_draft: 8,
                sizer: None,
            },
            |_| {},
        )?;
        let mut tokens = prompt.clone();
        tokens.extend_from_slice(&g.out.token_ids);
        let s = Sample {
            prompt_index: i as u32,
            prompt_len: prompt.len() as u32,
            tokens,
        };
        w.append(&s)?;
        have.push(s);
        progress(have.len(), p.samples);
    }
    Ok(have)
}
