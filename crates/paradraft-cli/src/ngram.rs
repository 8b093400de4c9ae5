//! `paradraft ngram`: build, convert and measure the n-gram tries that DART's tree search
//! scores drafts with (spec §2.6), and build DiffuSpec's 3-gram back-off model (spec §4.4).

use crate::{load, ModelArgs};
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use paradraft::ngram::{self, NgramTrie};
use paradraft::TokenId;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Subcommand)]
pub enum NgramCmd {
    /// Count a trie from JSON Lines corpora ({"text": ...} per line; .gz read compressed) with
    /// the target's tokenizer.
    Build(BuildArgs),
    /// Convert a trie in DART's published `.trie` layout.
    Convert(ConvertArgs),
    /// Query speed: microseconds to score 25 candidates after one context.
    Bench(BenchArgs),
    /// Estimate an interpolated modified Kneser–Ney 3-gram over the target's tokens from JSON
    /// Lines corpora and write it as ARPA (DiffuSpec's causal proxy); reports its query speed.
    Arpa(ArpaArgs),
}

#[derive(Args)]
pub struct ArpaArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// Corpus files (repeatable).
    #[arg(long = "corpus", required = true)]
    corpus: Vec<PathBuf>,
    #[arg(long)]
    out: PathBuf,
    /// Text whose tokens are the timing queries.
    #[arg(long, default_value = "data/bench/mt_bench.jsonl")]
    text: PathBuf,
}

#[derive(Args)]
pub struct BuildArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// Corpus files (repeatable).
    #[arg(long = "corpus", required = true)]
    corpus: Vec<PathBuf>,
    #[arg(long, default_value_t = 3)]
    order: usize,
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct ConvertArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// A DART `.trie` file built with this model's tokenizer.
    #[arg(long)]
    dart: PathBuf,
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    m: ModelArgs,
    #[arg(long)]
    trie: PathBuf,
    /// Text whose token pairs are the query contexts.
    #[arg(long, default_value = "data/bench/mt_bench.jsonl")]
    text: PathBuf,
    #[arg(long, default_value_t = 200_000)]
    queries: usize,
}

pub fn run(cmd: NgramCmd) -> Result<()> {
    match cmd {
        NgramCmd::Build(a) => build(a),
        NgramCmd::Convert(a) => convert(a),
        NgramCmd::Bench(a) => bench(a),
        NgramCmd::Arpa(a) => arpa(a),
    }
}

fn build(a: BuildArgs) -> Result<()> {
    ngram::defaults::check_writable(&a.out)?;
    let (lm, _) = load(&a.m)?;
    let pb = tokenizing_bar();
    let t0 = Instant::now();
    let threads = paradraft::runtime::default_threads();
    let trie = ngram::build_from_jsonl(&a.corpus, &lm.tokenizer, a.order, threads, |d, t| {
        pb.set_length(t);
        pb.set_position(d);
    })?;
    pb.finish();
    trie.write(&a.out)?;
    let size = std::fs::metadata(&a.out)?.len();
    eprintln!(
        "{} nodes ({} windows), order {}, {:.1} MB, built in {:.1} s: {}",
        trie.len(),
        trie.count(&[]),
        trie.order(),
        size as f64 / 1e6,
        t0.elapsed().as_secs_f64(),
        a.out.display()
    );
    Ok(())
}

fn convert(a: ConvertArgs) -> Result<()> {
    ngram::defaults::check_writable(&a.out)?;
    let (lm, _) = load(&a.m)?;
    let t0 = Instant::now();
    let trie = ngram::dart::convert(&a.dart, ngram::stamp_of(&lm.tokenizer))?;
    trie.write(&a.out)?;
    eprintln!(
        "{} nodes, order {}, converted in {:.1} s: {}",
        trie.len(),
        trie.order(),
        t0.elapsed().as_secs_f64(),
        a.out.display()
    );
    Ok(())
}

fn bench(a: BenchArgs) -> Result<()> {
    let (lm, _) = load(&a.m)?;
    let t0 = Instant::now();
    let trie = NgramTrie::open(&a.trie)?;
    trie.check_stamp(ngram::stamp_of(&lm.tokenizer), &a.trie)?;
    let open_ms = t0.elapsed().as_secs_f64() * 1e3;
    let text = std::fs::read_to_string(&a.text)?;
    let toks = lm.tokenizer.encode(&text)?;
    if toks.len() < 3 {
        bail!("{} has too little text", a.text.display());
    }
    // Candidates: the true next token and 24 others drawn from the text, as a drafter's top-25
    // mixes likely and unlikely tokens.
    let n = a.queries.max(1);
    let (mut p, mut m) = ([0f32; 25], [0u8; 25]);
    let mut cands = [TokenId(0); 25];
    let mut hit = 0usize;
    let mut sum = 0f64;
    let t0 = Instant::now();
    for q in 0..n {
        let i = 2 + q % (toks.len() - 2);
        for (j, c) in cands.iter_mut().enumerate() {
            *c = toks[(i + j * 7919) % toks.len()];
        }
        trie.probs(&toks[i - 2..i], &cands, &mut p, &mut m);
        hit += (m[0] > 0) as usize;
        sum += p[0] as f64;
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!(
        "{} nodes, order {}; opened and validated in {open_ms:.1} ms; {us:.3} µs per query of 25 candidates ({n} queries); the true next token is found in {:.1} % of queries (mean p {:.3})",
        trie.len(),
        trie.order(),
        100.0 * hit as f64 / n as f64,
        sum / n as f64
    );
    // A whole tree search per drafting round (DART §3.3 defaults, 60 nodes): top-25 of every
    // depth's 8,192 draft logits, then the n-gram-scored beam search. Logits are pseudo-random.
    let trie = std::sync::Arc::new(trie);
    for depths in [8usize, 15] {
        let v = 8192.min(lm.model.config.vocab_size);
        let mut x = 7u64;
        let logits: Vec<f32> = (0..depths * v)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 12.0
            })
            .collect();
        let stop = lm.tokenizer.stop_tokens.iter().copied().collect();
        let mut td = paradraft::speculative::tree_search::TreeDrafting::new(
            Default::default(),
            Some(trie.clone()),
            stop,
        );
        let rounds = 200;
        let t0 = Instant::now();
        for r in 0..rounds {
            let end = 3 + r % (toks.len() - 3);
            td.draft(&logits, v, |i| TokenId(i as u32), &toks[..end], 60)?;
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3 / rounds as f64;
        let t0 = Instant::now();
        let mut idx = vec![];
        for _ in 0..rounds {
            for d in 0..depths {
                let row = &logits[d * v..(d + 1) * v];
                paradraft::speculative::tree_search::Level::from_logits_in(
                    row,
                    25,
                    |i| TokenId(i as u32),
                    &mut idx,
                );
            }
        }
        let topk = t0.elapsed().as_secs_f64() * 1e3 / rounds as f64;
        println!(
            "tree search, {depths} depths × {v} logits, 60 nodes: {ms:.3} ms per round (top-25 selection {topk:.3} ms)"
        );
    }
    Ok(())
}

fn arpa(a: ArpaArgs) -> Result<()> {
    ngram::defaults::check_writable(&a.out)?;
    let (lm, _) = load(&a.m)?;
    let pb = tokenizing_bar();
    let t0 = Instant::now();
    let threads = paradraft::runtime::default_threads();
    let model = ngram::arpa_from_jsonl(&a.corpus, &lm.tokenizer, threads, |d, t| {
        pb.set_length(t);
        pb.set_position(d);
    })?;
    pb.finish();
    let built = t0.elapsed().as_secs_f64();
    model.write(&a.out)?;
    let size = std::fs::metadata(&a.out)?.len();
    let t0 = Instant::now();
    let back = ngram::arpa::ArpaLm::read(&a.out)?;
    let read_s = t0.elapsed().as_secs_f64();
    // Query speed: every token of the text after its two predecessors, repeated.
    let toks = lm.tokenizer.encode(&std::fs::read_to_string(&a.text)?)?;
    if toks.len() < 3 {
        bail!("{} has too little text", a.text.display());
    }
    let n = 1_000_000usize;
    let mut sum = 0f64;
    let t0 = Instant::now();
    for q in 0..n {
        let i = 2 + q % (toks.len() - 2);
        sum += back.ln_token(&toks[i - 2..i], toks[i]) as f64;
    }
    let ns = t0.elapsed().as_secs_f64() * 1e9 / n as f64;
    println!(
        "{} words, order {}, {:.1} MB, built in {built:.1} s, read back in {read_s:.1} s: {}; {ns:.0} ns per query ({n} queries, mean ln p {:.3})",
        back.vocab_len(),
        back.order(),
        size as f64 / 1e6,
        a.out.display(),
        sum / n as f64
    );
    Ok(())
}

/// A progress bar over the corpus bytes read.
fn tokenizing_bar() -> ProgressBar {
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template(
            "tokenizing {bar:40} {bytes}/{total_bytes} [{elapsed_precise} < {eta_precise}]",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}
