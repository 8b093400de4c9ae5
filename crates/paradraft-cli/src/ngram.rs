//! `paradraft ngram`: build, convert and measure the n-gram tries that DART's tree search
//! scores drafts with (docs/dart.md), and build DiffuSpec's 3-gram back-off model (docs/diffuspec.md).

use crate::ModelArgs;
use anyhow::Result;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use paradraft::ngram;
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
    /// `--drafter auto`'s suffix cache: fill it with corpus text and time its lookups (what each
    /// drafting round asks) after contexts from another text.
    SuffixBench(SuffixBenchArgs),
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

#[derive(Args)]
pub struct SuffixBenchArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// Corpus files whose text fills the cache (JSON Lines, `{"text": ...}`, `.gz` read
    /// compressed).
    #[arg(
        long = "corpus",
        default_value = "data/corpus/corpus_permissive.jsonl.gz"
    )]
    corpus: Vec<PathBuf>,
    /// Tokens the cache holds (and is filled with, when the corpus has them).
    #[arg(long, default_value_t = 1 << 20)]
    tokens: usize,
    /// Text whose tokens are the lookup contexts.
    #[arg(long, default_value = "data/bench/mt_bench.jsonl")]
    text: PathBuf,
    #[arg(long, default_value_t = 100_000)]
    queries: usize,
}

pub fn run(cmd: NgramCmd) -> Result<()> {
    match cmd {
        NgramCmd::Build(a) => build(a),
        NgramCmd::Convert(a) => convert(a),
        NgramCmd::Bench(a) => bench(a),
        NgramCmd::Arpa(a) => arpa(a),
        NgramCmd::SuffixBench(a) => suffix_bench(a),
    }
}

fn suffix_bench(a: SuffixBenchArgs) -> Result<()> {
    let (lm, _) = a.m.load()?;
    let text = std::fs::read_to_string(&a.text)?;
    let toks =
        paradraft::bench::ngram::tokens(&lm.tokenizer, &text, &a.text.display().to_string())?;
    let threads = paradraft::runtime::default_threads();
    let line = paradraft::bench::ngram::suffix(
        &lm.tokenizer,
        &a.corpus,
        a.tokens,
        &toks,
        a.queries,
        threads,
    )?;
    println!("{line} (contexts from {})", a.text.display());
    Ok(())
}

fn build(a: BuildArgs) -> Result<()> {
    ngram::defaults::check_writable(&a.out)?;
    let (lm, _) = a.m.load()?;
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
    let (lm, _) = a.m.load()?;
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
    let (lm, _) = a.m.load()?;
    let text = std::fs::read_to_string(&a.text)?;
    let toks =
        paradraft::bench::ngram::tokens(&lm.tokenizer, &text, &a.text.display().to_string())?;
    let vocab = lm.model.config.vocab_size;
    let report =
        paradraft::bench::ngram::trie_file(&a.trie, &lm.tokenizer, vocab, &toks, a.queries)?;
    println!("{report}");
    Ok(())
}

fn arpa(a: ArpaArgs) -> Result<()> {
    ngram::defaults::check_writable(&a.out)?;
    let (lm, _) = a.m.load()?;
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
    let text = std::fs::read_to_string(&a.text)?;
    let toks =
        paradraft::bench::ngram::tokens(&lm.tokenizer, &text, &a.text.display().to_string())?;
    println!(
        "{}",
        paradraft::bench::ngram::arpa_file(&a.out, &toks, built)?
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
