//! DART's n-gram trie (DART §3.3 "continuity-aware tree pruning"; docs/dart.md), exact semantics:
//!
//! - **Counting.** Each document (its tokens, then one EOS) contributes, for every start
//!   position `s`, the window `tokens[s .. min(len, s + order)]`; inserting a window adds one
//!   to every node on its path, the root included. So a node's count is the number of times
//!   its n-gram occurs in the corpus, and the root's is the number of windows.
//! - **Query.** Longest-match MLE: for context lengths `min(order − 1, |ctx|)` down to 1, walk
//!   the last `len` context tokens from the root; at the node reached, every candidate not yet
//!   scored that is a child gets `count(child) / count(node)`. Candidates never matched get 0
//!   (no unigram level, no discounting, no back-off weights, no normalisation).
//!
//! The file is ours (DART's format is read by [`super::dart`]): little-endian u32 words, a
//! 16-word header (magic, order, the vocabulary size and a tokenizer fingerprint it was built
//! with, the node count), then three arrays in breadth-first node order — `token[n]`,
//! `count[n]`, `first_child[n + 1]` (node i's children are the nodes `first_child[i] ..
//! first_child[i + 1]`, sorted by token). Memory-mapped; validated once when opened, so a
//! query never reads out of bounds.

use crate::error::{Error, Result};
use crate::types::TokenId;
use memmap2::Mmap;
use std::path::{Path, PathBuf};

const MAGIC: [u32; 2] = [u32::from_le_bytes(*b"PDTR"), u32::from_le_bytes(*b"IE01")];
const HEADER_WORDS: usize = 16;
/// The root's token slot.
const NO_TOKEN: u32 = u32::MAX;
/// Longest n-gram the builder counts (windows are packed into a u128).
pub const MAX_BUILD_ORDER: usize = 4;

/// The tokenizer a table was built with: its vocabulary size and [`fingerprint`].
///
/// [`fingerprint`]: crate::model::Tokenizer::fingerprint
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrieStamp {
    pub vocab_size: u32,
    pub fingerprint: u64,
}

enum Store {
    Mapped(Mmap),
    Owned(Vec<u32>),
}

/// A read-only n-gram trie (memory-mapped, or built in memory).
pub struct NgramTrie {
    store: Store,
    order: usize,
    stamp: TrieStamp,
    n: usize,
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::BadModelFile {
        path: path.to_path_buf(),
        format: "paradraft n-gram trie",
        reason: reason.into(),
    }
}

impl NgramTrie {
    /// Opens and validates a trie file.
    pub fn open(path: &Path) -> Result<Self> {
        let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the file is opened read-only and not modified while mapped (a trie file is
        // written once, to a temporary name, and renamed into place).
        let map = unsafe { Mmap::map(&f) }.map_err(|e| Error::io(path, e))?;
        if cfg!(target_endian = "big") {
            return Err(bad(path, "little-endian machines only"));
        }
        if map.len() % 4 != 0 || map.len() < HEADER_WORDS * 4 {
            return Err(bad(path, format!("{} bytes is not a trie", map.len())));
        }
        let t = NgramTrie {
            store: Store::Mapped(map),
            order: 0,
            stamp: TrieStamp {
                vocab_size: 0,
                fingerprint: 0,
            },
            n: 0,
        };
        t.validated(path)
    }

    /// A trie from its parts (breadth-first arrays), validated like a file.
    pub(crate) fn from_parts(
        order: usize,
        stamp: TrieStamp,
        token: &[u32],
        count: &[u32],
        first_child: &[u32],
    ) -> Result<Self> {
        let n = token.len();
        let mut w = Vec::with_capacity(HEADER_WORDS + 3 * n + 1);
        w.extend_from_slice(&MAGIC);
        w.push(order as u32);
        w.push(stamp.vocab_size);
        w.push(stamp.fingerprint as u32);
        w.push((stamp.fingerprint >> 32) as u32);
        w.push(n as u32);
        w.push((n as u64 >> 32) as u32);
        w.resize(HEADER_WORDS, 0);
        w.extend_from_slice(token);
        w.extend_from_slice(count);
        w.extend_from_slice(first_child);
        let t = NgramTrie {
            store: Store::Owned(w),
            order: 0,
            stamp,
            n: 0,
        };
        t.validated(Path::new("<in memory>"))
    }

    fn words(&self) -> &[u32] {
        match &self.store {
            Store::Owned(v) => v,
            Store::Mapped(m) => {
                // SAFETY: a mapping is page-aligned and its length a multiple of 4 (checked in
                // `open`); every bit pattern is a valid u32.
                let (pre, w, post) = unsafe { m.align_to::<u32>() };
                debug_assert!(pre.is_empty() && post.is_empty());
                w
            }
        }
    }

    /// Reads the header and checks every structural invariant a query relies on.
    fn validated(mut self, path: &Path) -> Result<Self> {
        let w = self.words();
        if w.len() < HEADER_WORDS || w[..2] != MAGIC {
            return Err(bad(path, "no trie header (wrong magic)"));
        }
        let order = w[2] as usize;
        let stamp = TrieStamp {
            vocab_size: w[3],
            fingerprint: w[4] as u64 | (w[5] as u64) << 32,
        };
        let n = w[6] as u64 | (w[7] as u64) << 32;
        if order == 0 || order > 16 {
            return Err(bad(path, format!("order {order}")));
        }
        let want = (HEADER_WORDS as u64).saturating_add(n.saturating_mul(3).saturating_add(1));
        if n == 0 || n > u32::MAX as u64 || want != w.len() as u64 {
            return Err(bad(
                path,
                format!(
                    "{n} nodes need {want} words, the file has {} (truncated or corrupt)",
                    w.len()
                ),
            ));
        }
        let n = n as usize;
        let (token, rest) = w[HEADER_WORDS..].split_at(n);
        let (count, first) = rest.split_at(n);
        if token[0] != NO_TOKEN || first[0] != 1 || first[n] != n as u32 {
            return Err(bad(path, "the root or the child table is malformed"));
        }
        for i in 0..n {
            let (a, b) = (first[i] as usize, first[i + 1] as usize);
            if b < a || b > n || (a <= i && a < b) {
                return Err(bad(path, format!("node {i}: child range {a}..{b}")));
            }
            if a < b && count[i] == 0 {
                return Err(bad(path, format!("node {i} has children but count 0")));
            }
            for c in a..b {
                if token[c] >= stamp.vocab_size {
                    return Err(bad(
                        path,
                        format!("token {} outside the vocabulary", token[c]),
                    ));
                }
                if c > a && token[c] <= token[c - 1] {
                    return Err(bad(path, format!("children of node {i} are not sorted")));
                }
                if count[c] > count[i] {
                    return Err(bad(path, format!("node {c} counts more than its parent")));
                }
            }
        }
        self.order = order;
        self.stamp = stamp;
        self.n = n;
        Ok(self)
    }

    fn arrays(&self) -> (&[u32], &[u32], &[u32]) {
        let w = &self.words()[HEADER_WORDS..];
        let (token, rest) = w.split_at(self.n);
        let (count, first) = rest.split_at(self.n);
        (token, count, first)
    }

    #[cfg(test)]
    pub(crate) fn arrays_for_test(&self) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
        let (a, b, c) = self.arrays();
        (a.to_vec(), b.to_vec(), c.to_vec())
    }

    /// The n-gram order (3 for DART's published trie).
    pub fn order(&self) -> usize {
        self.order
    }

    pub fn stamp(&self) -> TrieStamp {
        self.stamp
    }

    /// Nodes, the root included.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n <= 1
    }

    /// Refuses a trie built with another tokenizer than `stamp`'s.
    pub fn check_stamp(&self, stamp: TrieStamp, what: &Path) -> Result<()> {
        if self.stamp != stamp {
            return Err(Error::BadRequest(format!(
                "n-gram trie {} was built with another tokenizer (vocabulary {}, fingerprint {:016x}; the model has {} and {:016x})",
                what.display(),
                self.stamp.vocab_size,
                self.stamp.fingerprint,
                stamp.vocab_size,
                stamp.fingerprint
            )));
        }
        Ok(())
    }

    /// The child of `node` with token `t`.
    fn child(&self, node: usize, t: u32) -> Option<usize> {
        let (token, _, first) = self.arrays();
        let (a, b) = (first[node] as usize, first[node + 1] as usize);
        find_sorted(&token[a..b], t).map(|i| a + i)
    }

    /// The node of an n-gram (`None`: it never occurred).
    fn find(&self, gram: &[TokenId]) -> Option<usize> {
        gram.iter().try_fold(0, |n, t| self.child(n, t.0))
    }

    /// Occurrences of `gram` in the corpus (the empty gram: the number of windows).
    pub fn count(&self, gram: &[TokenId]) -> u32 {
        self.find(gram).map_or(0, |n| self.arrays().1[n])
    }

    /// Longest-match MLE of each candidate after `context` into `probs`, and the context length
    /// that scored it into `matched` (0: unseen, probability 0).
    pub fn probs(
        &self,
        context: &[TokenId],
        candidates: &[TokenId],
        probs: &mut [f32],
        matched: &mut [u8],
    ) {
        probs.fill(0.0);
        matched.fill(0);
        let (token, count, first) = self.arrays();
        let mut left = candidates.len();
        let longest = self.order.saturating_sub(1).min(context.len());
        for len in (1..=longest).rev() {
            let Some(node) = self.find(&context[context.len() - len..]) else {
                continue;
            };
            let (a, b) = (first[node] as usize, first[node + 1] as usize);
            let kids = &token[a..b];
            let total = count[node] as f32;
            for (i, c) in candidates.iter().enumerate() {
                if matched[i] != 0 {
                    continue;
                }
                if let Some(at) = find_sorted(kids, c.0) {
                    probs[i] = count[a + at] as f32 / total;
                    matched[i] = len as u8;
                    left -= 1;
                }
            }
            if left == 0 {
                break;
            }
        }
    }

    /// The `k` most frequent tokens after the longest suffix of `context` (at most order − 1
    /// tokens) that the corpus has continuations for, with their MLE probabilities (count of
    /// the continuation / count of the context), most frequent first; and the length of the
    /// context that matched (0: none did, nothing returned).
    pub fn continuations(&self, context: &[TokenId], k: usize) -> (usize, Vec<(TokenId, f32)>) {
        let (token, count, first) = self.arrays();
        let longest = self.order.saturating_sub(1).min(context.len());
        for len in (1..=longest).rev() {
            let Some(node) = self.find(&context[context.len() - len..]) else {
                continue;
            };
            let (a, b) = (first[node] as usize, first[node + 1] as usize);
            if a == b {
                continue;
            }
            let mut kids: Vec<usize> = (a..b).filter(|&i| token[i] != NO_TOKEN).collect();
            let by_count = |&x: &usize, &y: &usize| count[y].cmp(&count[x]).then(x.cmp(&y));
            if kids.len() > k {
                kids.select_nth_unstable_by(k, by_count);
                kids.truncate(k);
            }
            kids.sort_by(by_count);
            let total = count[node] as f32;
            let out = kids
                .into_iter()
                .map(|i| (TokenId(token[i]), count[i] as f32 / total))
                .collect();
            return (len, out);
        }
        (0, vec![])
    }

    /// Writes the trie (to a temporary name, then renamed into place).
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut tmp = PathBuf::from(path);
        tmp.as_mut_os_string().push(".tmp");
        let mut bytes = Vec::with_capacity(self.words().len() * 4);
        for w in self.words() {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        std::fs::write(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
    }
}

/// The index of `t` in the strictly increasing `s` (a scan for short lists).
#[inline]
fn find_sorted(s: &[u32], t: u32) -> Option<usize> {
    if s.len() <= 16 {
        return s.iter().position(|&x| x == t);
    }
    s.binary_search(&t).ok()
}

/// Counts windows and builds a [`NgramTrie`] (in memory: 16 bytes per corpus token while
/// counting).
pub struct TrieBuilder {
    order: usize,
    /// One key per window: its tokens packed big-end first, padded with `NO_TOKEN`, so that
    /// numeric order is the windows' lexicographic order.
    keys: Vec<u128>,
}

impl TrieBuilder {
    pub fn new(order: usize) -> Result<Self> {
        if order == 0 || order > MAX_BUILD_ORDER {
            return Err(Error::BadRequest(format!(
                "n-gram order {order}: 1 to {MAX_BUILD_ORDER} are supported"
            )));
        }
        Ok(TrieBuilder {
            order,
            keys: vec![],
        })
    }

    /// Adds one document's windows (`tokens` already ends with the EOS the spec appends).
    pub fn add_document(&mut self, tokens: &[TokenId]) {
        for s in 0..tokens.len() {
            let mut k = 0u128;
            for i in 0..MAX_BUILD_ORDER {
                let t = match tokens.get(s + i) {
                    Some(t) if i < self.order => t.0,
                    _ => NO_TOKEN,
                };
                k = k << 32 | t as u128;
            }
            self.keys.push(k);
        }
    }

    /// Windows counted so far.
    pub fn windows(&self) -> usize {
        self.keys.len()
    }

    pub fn finish(mut self, stamp: TrieStamp) -> Result<NgramTrie> {
        if self.keys.len() >= u32::MAX as usize {
            return Err(Error::BadRequest(format!(
                "{} windows overflow the trie's 32-bit counts",
                self.keys.len()
            )));
        }
        self.keys.sort_unstable();
        let keys = &self.keys;
        let mut token = vec![NO_TOKEN];
        let mut count = vec![keys.len() as u32];
        let mut parent = vec![0u32];
        let mut prev_level = 0usize; // index of the first node of depth d − 1
        for d in 1..=self.order {
            let level = token.len();
            let shift = 32 * (MAX_BUILD_ORDER - d);
            let (mut i, mut ord, mut last_pp) = (0, 0usize, None);
            while i < keys.len() {
                let pre = keys[i] >> shift;
                let mut j = i + 1;
                while j < keys.len() && keys[j] >> shift == pre {
                    j += 1;
                }
                // The parent's ordinal among the depth-(d − 1) nodes (which appear in the
                // same sorted order, childless ones included).
                let pp = pre >> 32;
                if d > 1 && last_pp != Some(pp) && pp as u32 != NO_TOKEN {
                    if last_pp.is_some() {
                        ord += 1;
                    }
                    last_pp = Some(pp);
                }
                let t = pre as u32;
                if t != NO_TOKEN {
                    if t >= stamp.vocab_size {
                        return Err(Error::BadRequest(format!(
                            "token {t} outside the vocabulary of {}",
                            stamp.vocab_size
                        )));
                    }
                    token.push(t);
                    count.push((j - i) as u32);
                    parent.push((prev_level + ord) as u32);
                }
                i = j;
            }
            prev_level = level;
        }
        let n = token.len();
        let mut first = vec![0u32; n + 1];
        for &p in &parent[1..] {
            first[p as usize + 1] += 1;
        }
        first[0] = 1;
        for i in 0..n {
            first[i + 1] += first[i];
        }
        // `first[i]` now starts node i's children; the last entry is n.
        first[n] = n as u32;
        NgramTrie::from_parts(self.order, stamp, &token, &count, &first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u32]) -> Vec<TokenId> {
        v.iter().map(|&t| TokenId(t)).collect()
    }

    const STAMP: TrieStamp = TrieStamp {
        vocab_size: 10,
        fingerprint: 0xfeed,
    };

    /// Documents "1 2 3 1 2 4" and "2 3", EOS = 9, order 3 — counted by hand.
    fn example() -> NgramTrie {
        let mut b = TrieBuilder::new(3).unwrap();
        b.add_document(&ids(&[1, 2, 3, 1, 2, 4, 9]));
        b.add_document(&ids(&[2, 3, 9]));
        b.finish(STAMP).unwrap()
    }

    /// Continuations come from the longest context with any, most frequent first.
    #[test]
    fn continuations_of_the_longest_context() {
        let t = example();
        let (len, c) = t.continuations(&ids(&[1, 2]), 5);
        assert_eq!((len, c), (2, vec![(TokenId(3), 0.5), (TokenId(4), 0.5)]));
        let (len, c) = t.continuations(&ids(&[7, 2]), 5);
        assert_eq!(len, 1);
        assert_eq!(c, vec![(TokenId(3), 2.0 / 3.0), (TokenId(4), 1.0 / 3.0)]);
        assert_eq!(
            t.continuations(&ids(&[7, 2]), 1).1,
            vec![(TokenId(3), 2.0 / 3.0)]
        );
        assert_eq!(t.continuations(&ids(&[5]), 5), (0, vec![]));
        assert_eq!(t.continuations(&[], 5), (0, vec![]));
    }

    #[test]
    fn counts_are_occurrences() {
        let t = example();
        assert_eq!(t.count(&[]), 10, "one window per position, EOS included");
        assert_eq!(t.count(&ids(&[2])), 3);
        assert_eq!(t.count(&ids(&[1, 2])), 2);
        assert_eq!(t.count(&ids(&[2, 3])), 2);
        assert_eq!(t.count(&ids(&[2, 3, 9])), 1);
        assert_eq!(t.count(&ids(&[2, 3, 1])), 1);
        assert_eq!(t.count(&ids(&[4, 9])), 1);
        assert_eq!(t.count(&ids(&[9])), 2);
        assert_eq!(t.count(&ids(&[3, 9])), 1);
        assert_eq!(t.count(&ids(&[1, 2, 3, 1])), 0, "deeper than the order");
        assert_eq!(t.count(&ids(&[5])), 0);
        // nodes: root, 5 unigrams (1 2 3 4 9), bigrams 12 23 24 31 39 49, trigrams
        // 123 124 231 239 312 249
        assert_eq!(t.len(), 1 + 5 + 6 + 6);
    }

    #[test]
    fn longest_match_mle() {
        let t = example();
        let (mut p, mut m) = ([0f32; 4], [0u8; 4]);
        // context [1, 2]: trigram node "1 2" has children 3 and 4 (1 each of 2);
        // 9 is unseen after "1 2" and after "2", 1 is seen only after "3".
        t.probs(&ids(&[7, 1, 2]), &ids(&[3, 4, 9, 1]), &mut p, &mut m);
        assert_eq!(p, [0.5, 0.5, 0.0, 0.0]);
        assert_eq!(m, [2, 2, 0, 0]);
        // context [4, 2]: "4 2" never occurred, so the bigram level scores: after "2",
        // 3 twice and 4 once out of 3.
        t.probs(&ids(&[4, 2]), &ids(&[4, 3]), &mut p[..2], &mut m[..2]);
        assert_eq!(p[..2], [1.0 / 3.0, 2.0 / 3.0]);
        assert_eq!(m[..2], [1, 1]);
        // mixed lengths: after [2, 3], 1 and 9 match at length 2; nothing else
        t.probs(&ids(&[2, 3]), &ids(&[1, 9, 2]), &mut p[..3], &mut m[..3]);
        assert_eq!(p[..3], [0.5, 0.5, 0.0]);
        // an empty context scores nothing
        t.probs(&[], &ids(&[1]), &mut p[..1], &mut m[..1]);
        assert_eq!(p[0], 0.0);
    }

    #[test]
    fn file_roundtrip_and_corruption() {
        let t = example();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.trie");
        t.write(&path).unwrap();
        let u = NgramTrie::open(&path).unwrap();
        assert_eq!((u.order(), u.stamp(), u.len()), (3, STAMP, t.len()));
        assert_eq!(u.words(), t.words());
        assert!(u
            .check_stamp(
                TrieStamp {
                    vocab_size: 10,
                    fingerprint: 1
                },
                &path
            )
            .is_err());
        let bytes = std::fs::read(&path).unwrap();
        // truncated anywhere: an error, never a panic
        for cut in [0, 3, 40, 64, 65, bytes.len() - 4, bytes.len() - 1] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let e = NgramTrie::open(&path)
                .err()
                .expect("truncated file refused");
            assert!(e.to_string().contains("trie"), "{e}");
        }
        // every single corrupted word: refused or still safe to query
        for w in 0..bytes.len() / 4 {
            let mut b = bytes.clone();
            b[4 * w..4 * w + 4].copy_from_slice(&0x7fff_fff0u32.to_le_bytes());
            std::fs::write(&path, &b).unwrap();
            if let Ok(u) = NgramTrie::open(&path) {
                let (mut p, mut m) = ([0f32; 3], [0u8; 3]);
                u.probs(&ids(&[1, 2]), &ids(&[3, 4, 9]), &mut p, &mut m);
                assert!(p.iter().all(|x| (0.0..=1.0).contains(x)));
            }
        }
    }

    #[test]
    fn find_agrees_with_binary_search() {
        let mut seed = 12345u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for n in [0, 1, 5, 16, 17, 40, 300, 5000] {
            let mut v: Vec<u32> = (0..n).map(|_| rnd() % 50_000).collect();
            v.sort_unstable();
            v.dedup();
            for _ in 0..2000 {
                let t = rnd() % 50_010;
                assert_eq!(find_sorted(&v, t), v.binary_search(&t).ok(), "{t} in {n}");
            }
            for (i, &t) in v.iter().enumerate() {
                assert_eq!(find_sorted(&v, t), Some(i));
            }
        }
    }

    #[test]
    fn builder_refuses_bad_orders_and_tokens() {
        assert!(TrieBuilder::new(0).is_err());
        assert!(TrieBuilder::new(5).is_err());
        let mut b = TrieBuilder::new(2).unwrap();
        b.add_document(&ids(&[1, 12]));
        assert!(b.finish(STAMP).is_err());
    }
}
