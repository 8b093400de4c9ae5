//! What `paradraft ngram bench` and `ngram arpa` measure: trie queries and whole tree searches
//! per drafting round, 3-gram ARPA queries, on the tokens of a text.

use crate::error::{Error, Result};
use crate::model::Tokenizer;
use crate::ngram::arpa::ArpaLm;
use crate::ngram::NgramTrie;
use crate::types::TokenId;
use std::sync::Arc;
use std::time::Instant;

/// `text` tokenized, with enough tokens for a query (`what` names it in the error).
pub fn tokens(tok: &Tokenizer, text: &str, what: &str) -> Result<Vec<TokenId>> {
    let toks = tok.encode(text)?;
    if toks.len() < 3 {
        return Err(Error::BadRequest(format!("{what} has too little text")));
    }
    Ok(toks)
}

/// Trie query speed (25 candidates: the true next token and 24 others from the text, as a
/// drafter's top-25 mixes likely and unlikely tokens) over `queries` queries, then a whole tree
/// search per drafting round (DART §3.3 defaults, 60 nodes, pseudo-random logits over
/// `vocab` ids, 8 and 15 depths). One line per measurement.
pub fn trie(
    trie: NgramTrie,
    toks: &[TokenId],
    queries: usize,
    vocab: usize,
    stop: Vec<TokenId>,
) -> Result<Vec<String>> {
    let n = queries.max(1);
    let (mut p, mut m) = ([0f32; 25], [0u8; 25]);
    let mut cands = [TokenId(0); 25];
    let (mut hit, mut sum) = (0usize, 0f64);
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
    let mut lines = vec![format!(
        "{us:.3} µs per query of 25 candidates ({n} queries); the true next token is found in {:.1} % of queries (mean p {:.3})",
        100.0 * hit as f64 / n as f64,
        sum / n as f64
    )];
    let trie = Arc::new(trie);
    for depths in [8usize, 15] {
        let v = 8192.min(vocab);
        let mut x = 7u64;
        let logits: Vec<f32> = (0..depths * v)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 12.0
            })
            .collect();
        let mut td = crate::speculative::tree_search::TreeDrafting::new(
            Default::default(),
            Some(trie.clone()),
            stop.clone(),
        );
        let rounds = 200;
        let t0 = Instant::now();
        for r in 0..rounds {
            let end = 3 + r % (toks.len() - 3);
            td.draft(&logits, v, |i| TokenId(i as u32), &toks[..end], 60, None)?;
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3 / rounds as f64;
        let t0 = Instant::now();
        let mut idx = vec![];
        for _ in 0..rounds {
            for d in 0..depths {
                let row = &logits[d * v..(d + 1) * v];
                crate::speculative::tree_search::Level::from_logits_in(
                    row,
                    25,
                    |i| TokenId(i as u32),
                    &mut idx,
                );
            }
        }
        let topk = t0.elapsed().as_secs_f64() * 1e3 / rounds as f64;
        lines.push(format!(
            "tree search, {depths} depths × {v} logits, 60 nodes: {ms:.3} ms per round (top-25 selection {topk:.3} ms)"
        ));
    }
    Ok(lines)
}

/// ARPA query speed: every token of `toks` after its two predecessors, a million queries:
/// (ns per query, queries, mean ln p).
pub fn arpa(model: &ArpaLm, toks: &[TokenId]) -> (f64, usize, f64) {
    let n = 1_000_000usize;
    let mut sum = 0f64;
    let t0 = Instant::now();
    for q in 0..n {
        let i = 2 + q % (toks.len() - 2);
        sum += model.ln_token(&toks[i - 2..i], toks[i]) as f64;
    }
    (
        t0.elapsed().as_secs_f64() * 1e9 / n as f64,
        n,
        sum / n as f64,
    )
}

/// `paradraft ngram suffix-bench`: a suffix cache of `capacity` tokens filled with the texts of
/// `corpus` (tokenized on `threads` threads), then [`crate::ngram::suffix::bench_lookups`] after
/// 64-token contexts from `contexts`; one line.
pub fn suffix(
    tok: &Tokenizer,
    corpus: &[std::path::PathBuf],
    capacity: usize,
    contexts: &[TokenId],
    queries: usize,
    threads: usize,
) -> Result<String> {
    let mut ix = crate::ngram::suffix::SuffixIndex::new(capacity, &[1, 2, 4]);
    let t0 = Instant::now();
    let mut filled = 0usize;
    crate::ngram::for_each_document(
        corpus,
        tok,
        threads,
        |_, _| {},
        |doc| {
            if filled < capacity {
                filled += doc.len() + 1;
                ix.extend(&doc);
                ix.end_document();
            }
        },
    )?;
    let fill_s = t0.elapsed().as_secs_f64();
    let (us, hit) = crate::ngram::suffix::bench_lookups(&ix, contexts, 64, queries);
    Ok(format!(
        "{} tokens cached ({:.1} MB, filled and tokenized in {fill_s:.1} s); {us:.2} µs per lookup ({queries} lookups of 64-token contexts); {:.1} % found a match",
        ix.len(),
        ix.bytes() as f64 / 1e6,
        100.0 * hit
    ))
}

/// `paradraft ngram bench`: opens and validates the trie at `path` (stamped for `tok`), then
/// [`trie`] after the tokens `toks`; the report's lines.
pub fn trie_file(
    path: &std::path::Path,
    tok: &Tokenizer,
    vocab: usize,
    toks: &[TokenId],
    queries: usize,
) -> Result<String> {
    let t0 = Instant::now();
    let t = NgramTrie::open(path)?;
    t.check_stamp(crate::ngram::stamp_of(tok), path)?;
    let open_ms = t0.elapsed().as_secs_f64() * 1e3;
    let (len, order) = (t.len(), t.order());
    let stop = tok.stop_tokens.iter().copied().collect();
    let lines = trie(t, toks, queries, vocab, stop)?;
    Ok(format!(
        "{len} nodes, order {order}; opened and validated in {open_ms:.1} ms; {}",
        lines.join("\n")
    ))
}

/// `paradraft ngram arpa`'s report: the model written at `path` (built in `built_s`) read
/// back and queried ([`arpa`]) on `toks`.
pub fn arpa_file(path: &std::path::Path, toks: &[TokenId], built_s: f64) -> Result<String> {
    let size = std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .len();
    let t0 = Instant::now();
    let back = ArpaLm::read(path)?;
    let read_s = t0.elapsed().as_secs_f64();
    let (ns, n, mean) = arpa(&back, toks);
    Ok(format!(
        "{} words, order {}, {:.1} MB, built in {built_s:.1} s, read back in {read_s:.1} s: {}; {ns:.0} ns per query ({n} queries, mean ln p {:.3})",
        back.vocab_len(),
        back.order(),
        size as f64 / 1e6,
        path.display(),
        mean
    ))
}
