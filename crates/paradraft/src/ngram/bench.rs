//! What `paradraft ngram bench` and `ngram arpa` measure: trie queries and whole tree searches
//! per drafting round, 3-gram ARPA queries, on the tokens of a text.

use super::arpa::ArpaLm;
use super::NgramTrie;
use crate::error::{Error, Result};
use crate::model::Tokenizer;
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
            td.draft(&logits, v, |i| TokenId(i as u32), &toks[..end], 60)?;
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
