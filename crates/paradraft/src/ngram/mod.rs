//! N-gram models shared by the drafters.
//!
//! - [`trie`]: DART's n-gram trie (DART §3.3, docs/dart.md): windows counted per start position,
//!   the unsmoothed longest-match MLE query, in a memory-mapped CSR file of our own.
//! - [`dart`]: a reader of DART's published `.trie` files, converted to that layout.
//! - [`arpa`]: DiffuSpec's causal proxy (docs/diffuspec.md): a token-level 3-gram back-off model, read
//!   from ARPA files or estimated (interpolated modified Kneser–Ney) from a corpus.

pub mod arpa;
pub mod dart;
pub mod defaults;
pub mod grams;
pub mod suffix;
pub mod trie;

pub use trie::{NgramTrie, TrieBuilder, TrieStamp};

use crate::error::{Error, Result};
use crate::model::Tokenizer;
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};

/// The stamp of `tok`: what a table built with it records and checks.
pub fn stamp_of(tok: &Tokenizer) -> TrieStamp {
    TrieStamp {
        vocab_size: tok.vocab_size() as u32,
        fingerprint: tok.fingerprint(),
    }
}

/// Counts the bytes read through it (progress over compressed input).
struct Counted<R> {
    r: R,
    n: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.r.read(buf)?;
        self.n
            .fetch_add(k as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(k)
    }
}

/// Builds a trie of `order` from JSON Lines corpora (`{"text": ...}` per line, `.gz` read
/// compressed) with the target's tokenizer: each text is encoded as the model encodes a prompt
/// and one EOS is appended (docs/dart.md). Documents are tokenized on `threads` threads;
/// `on_progress(bytes read, total bytes)` follows the input files.
pub fn build_from_jsonl(
    paths: &[PathBuf],
    tok: &Tokenizer,
    order: usize,
    threads: usize,
    on_progress: impl FnMut(u64, u64),
) -> Result<NgramTrie> {
    let eos = tok.eos().ok_or_else(|| {
        Error::Unsupported("the tokenizer names no EOS token to end documents with".into())
    })?;
    let mut builder = TrieBuilder::new(order)?;
    for_each_document(paths, tok, threads, on_progress, |doc| {
        let mut d = doc;
        d.push(eos);
        builder.add_document(&d);
    })?;
    builder.finish(stamp_of(tok))
}

/// An interpolated modified Kneser–Ney 3-gram over the target's tokens of JSON Lines corpora
/// (as [`build_from_jsonl`] reads them; each text is one `<s>` … `</s>` sentence).
pub fn arpa_from_jsonl(
    paths: &[PathBuf],
    tok: &Tokenizer,
    threads: usize,
    on_progress: impl FnMut(u64, u64),
) -> Result<arpa::ArpaLm> {
    let mut builder = arpa::ArpaBuilder::new();
    for_each_document(paths, tok, threads, on_progress, |doc| {
        builder.add_document(&doc)
    })?;
    let mut lm = builder.finish()?;
    lm.stamp = Some(stamp_of(tok));
    Ok(lm)
}

/// Every text of JSON Lines corpora (`{"text": ...}` per line, `.gz` read compressed) encoded
/// with `tok` as the model encodes a prompt, in file order (tokenized on `threads` threads).
pub fn for_each_document(
    paths: &[PathBuf],
    tok: &Tokenizer,
    threads: usize,
    mut on_progress: impl FnMut(u64, u64),
    mut each: impl FnMut(Vec<crate::types::TokenId>),
) -> Result<()> {
    let total: u64 = paths
        .iter()
        .map(|p| {
            std::fs::metadata(p)
                .map(|m| m.len())
                .map_err(|e| Error::io(p, e))
        })
        .sum::<Result<u64>>()?;
    let mut done = 0u64;
    for path in paths {
        let n = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let raw = Counted { r: f, n: n.clone() };
        let r: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
            Box::new(flate2::read::MultiGzDecoder::new(raw))
        } else {
            Box::new(raw)
        };
        let mut lines = std::io::BufReader::with_capacity(1 << 20, r).lines();
        let mut line_no = 0usize;
        loop {
            // A batch of texts, then tokenized in parallel.
            let mut texts = Vec::with_capacity(2048);
            for line in lines.by_ref() {
                let line = line.map_err(|e| Error::io(path, e))?;
                line_no += 1;
                if line.trim().is_empty() {
                    continue;
                }
                texts.push(document_text(path, line_no, &line)?);
                if texts.len() == 2048 {
                    break;
                }
            }
            if texts.is_empty() {
                break;
            }
            for doc in tokenize_all(tok, &texts, threads.max(1))? {
                each(doc);
            }
            on_progress(done + n.load(std::sync::atomic::Ordering::Relaxed), total);
        }
        done += n.load(std::sync::atomic::Ordering::Relaxed);
    }
    Ok(())
}

fn document_text(path: &Path, line_no: usize, line: &str) -> Result<String> {
    #[derive(serde::Deserialize)]
    struct Doc {
        text: String,
    }
    serde_json::from_str::<Doc>(line)
        .map(|d| d.text)
        .map_err(|e| Error::BadModelFile {
            path: path.to_path_buf(),
            format: "JSON Lines corpus",
            reason: format!("line {line_no}: {e} (want {{\"text\": ...}})"),
        })
}

fn tokenize_all(
    tok: &Tokenizer,
    texts: &[String],
    threads: usize,
) -> Result<Vec<Vec<crate::TokenId>>> {
    let chunk = texts.len().div_ceil(threads);
    std::thread::scope(|s| {
        let hs: Vec<_> = texts
            .chunks(chunk.max(1))
            .map(|c| s.spawn(move || c.iter().map(|t| tok.encode(t)).collect::<Result<Vec<_>>>()))
            .collect();
        let mut out = Vec::with_capacity(texts.len());
        for h in hs {
            out.extend(h.join().expect("tokenizer thread")?);
        }
        Ok(out)
    })
}
