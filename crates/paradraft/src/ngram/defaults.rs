//! The default n-gram models on first use (issue #27): DART's trie and DiffuSpec's 3-gram ARPA
//! model for a target's tokenizer, built once from the corpus that ships with paradraft
//! (`data/corpus/corpus_permissive.jsonl.gz`) into `$PARADRAFT_HOME/ngram/`, named by the
//! tokenizer's fingerprint, and reused afterwards. A file built by hand at the documented path
//! (`data/ngram/smollm2-135m.{trie,arpa}`) is used when it fits the tokenizer; a damaged or
//! foreign cached file is rebuilt with a message saying so.

use super::arpa::ArpaLm;
use super::{stamp_of, NgramTrie};
use crate::error::{Error, Result};
use crate::model::Tokenizer;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The corpus the default models are built from (shipped in the repository).
pub const CORPUS: &str = "data/corpus/corpus_permissive.jsonl.gz";
/// The order of the default trie (DART's).
pub const TRIE_ORDER: usize = 3;

/// Which default model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Trie,
    Arpa,
}

impl Kind {
    fn ext(self) -> &'static str {
        match self {
            Kind::Trie => "trie",
            Kind::Arpa => "arpa",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Kind::Trie => "n-gram trie",
            Kind::Arpa => "3-gram ARPA model",
        }
    }
}

/// Where the default model for `tok` is cached under `home` (`$PARADRAFT_HOME`):
/// `home/ngram/<fingerprint>.<ext>`.
pub fn cache_path(home: &Path, tok: &Tokenizer, kind: Kind) -> PathBuf {
    home.join("ngram")
        .join(format!("{:016x}.{}", tok.fingerprint(), kind.ext()))
}

/// The hand-built file at the documented source-tree path, if any.
fn documented(kind: Kind) -> Option<PathBuf> {
    crate::fetch::resource(&format!("data/ngram/smollm2-135m.{}", kind.ext())).ok()
}

/// The default trie for `tok`: the documented hand-built file when it fits, else the one
/// cached in `$PARADRAFT_HOME`, built on first use.
pub fn trie(tok: &Tokenizer) -> Result<(PathBuf, NgramTrie)> {
    trie_in(tok, &crate::fetch::home_dir(), documented(Kind::Trie))
}

/// The default trie for `tok` when [`trie`] would open one already on disk, else `None`
/// (nothing built, nothing said): what a load opens ahead, beside the target's weights.
pub fn built_trie(tok: &Tokenizer) -> Option<NgramTrie> {
    built_trie_in(tok, &crate::fetch::home_dir(), documented(Kind::Trie))
}

/// [`built_trie`] for the cache under `home` and the hand-built file `hand_built`.
pub fn built_trie_in(
    tok: &Tokenizer,
    home: &Path,
    hand_built: Option<PathBuf>,
) -> Option<NgramTrie> {
    let open = |p: &Path| {
        let t = NgramTrie::open(p).ok()?;
        t.check_stamp(stamp_of(tok), p).ok().map(|()| t)
    };
    let cached = || open(&cache_path(home, tok, Kind::Trie));
    hand_built.and_then(|p| open(&p)).or_else(cached)
}

/// [`trie`] cached under `home`, preferring `hand_built` when it opens and fits `tok`.
pub fn trie_in(
    tok: &Tokenizer,
    home: &Path,
    hand_built: Option<PathBuf>,
) -> Result<(PathBuf, NgramTrie)> {
    let open = |p: &Path| -> Result<NgramTrie> {
        let t = NgramTrie::open(p)?;
        t.check_stamp(stamp_of(tok), p)?;
        Ok(t)
    };
    ensure(
        tok,
        Kind::Trie,
        home,
        hand_built,
        open,
        |corpus, progress| {
            let threads = crate::runtime::default_threads();
            let t = super::build_from_jsonl(
                &[corpus.to_path_buf()],
                tok,
                TRIE_ORDER,
                threads,
                progress,
            )?;
            Ok(Box::new(move |p: &Path| t.write(p)))
        },
    )
}

/// The default 3-gram ARPA model for `tok` (as [`trie`]).
pub fn arpa(tok: &Tokenizer) -> Result<(PathBuf, ArpaLm)> {
    arpa_in(tok, &crate::fetch::home_dir(), documented(Kind::Arpa))
}

/// [`arpa`] cached under `home`, preferring `hand_built` when it reads and fits `tok`.
pub fn arpa_in(
    tok: &Tokenizer,
    home: &Path,
    hand_built: Option<PathBuf>,
) -> Result<(PathBuf, ArpaLm)> {
    let open = |p: &Path| -> Result<ArpaLm> {
        let m = ArpaLm::read(p)?;
        m.check_stamp(stamp_of(tok), p)?;
        Ok(m)
    };
    ensure(
        tok,
        Kind::Arpa,
        home,
        hand_built,
        open,
        |corpus, progress| {
            let threads = crate::runtime::default_threads();
            let m = super::arpa_from_jsonl(&[corpus.to_path_buf()], tok, threads, progress)?;
            Ok(Box::new(move |p: &Path| m.write(p)))
        },
    )
}

type Writer = Box<dyn FnOnce(&Path) -> Result<()>>;

fn ensure<T>(
    tok: &Tokenizer,
    kind: Kind,
    home: &Path,
    hand_built: Option<PathBuf>,
    open: impl Fn(&Path) -> Result<T>,
    build: impl FnOnce(&Path, &mut dyn FnMut(u64, u64)) -> Result<Writer>,
) -> Result<(PathBuf, T)> {
    if let Some(p) = hand_built {
        if let Ok(t) = open(&p) {
            return Ok((p, t));
        }
    }
    let path = cache_path(home, tok, kind);
    if path.exists() {
        match open(&path) {
            Ok(t) => return Ok((path, t)),
            Err(e) => eprintln!(
                "paradraft: the cached {} {} cannot be used ({e}); rebuilding it",
                kind.what(),
                path.display()
            ),
        }
    }
    build_into(&path, kind, build)?;
    let t = open(&path)?;
    Ok((path, t))
}

/// Builds the default model into `path` (checked writable before the work), with a notice and
/// a progress bar on stderr.
fn build_into(
    path: &Path,
    kind: Kind,
    build: impl FnOnce(&Path, &mut dyn FnMut(u64, u64)) -> Result<Writer>,
) -> Result<()> {
    let corpus = crate::fetch::resource(CORPUS).map_err(|_| {
        Error::BadRequest(format!(
            "the {} needs its corpus {CORPUS}, which is not here ({}); pass a model you built \
             with `paradraft ngram build|arpa --corpus FILE --out PATH`",
            kind.what(),
            crate::fetch::resource_hint(CORPUS)
        ))
    })?;
    check_writable(path)?;
    eprintln!(
        "paradraft: building the default {} for this tokenizer from {} into {} (once; about a \
         minute on 2 cores)",
        kind.what(),
        corpus.display(),
        path.display()
    );
    let t0 = Instant::now();
    let pb = indicatif::ProgressBar::new(0);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "tokenizing {bar:40} {bytes}/{total_bytes} [{elapsed_precise} < {eta_precise}]",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let write = build(&corpus, &mut |d, t| {
        pb.set_length(t);
        pb.set_position(d);
    })?;
    pb.finish_and_clear();
    write(path)?;
    eprintln!(
        "paradraft: built {} in {:.0} s",
        path.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Creates `path`'s directory and proves a file can be written there, so a build never runs
/// for minutes only to fail at the end.
pub fn check_writable(path: &Path) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let cant = |e: std::io::Error| {
        Error::BadRequest(format!(
            "cannot write {} ({e}); set PARADRAFT_HOME to a writable directory or pick another --out",
            path.display()
        ))
    };
    std::fs::create_dir_all(dir).map_err(cant)?;
    let probe = dir.join(format!(".paradraft-write-test-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(cant)?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}
