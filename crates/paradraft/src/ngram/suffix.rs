//! A bounded index of token text for drafting by lookup: the request's own prompt and output
//! (prompt lookup) and, shared by a server's requests, earlier requests' text (a suffix cache,
//! as SuffixDecoding keeps). Given the committed text it finds earlier occurrences of its
//! longest suffix and returns their continuations as a small tree, each node scored by how
//! often the matches continue that way.
//!
//! The text is a ring of at most `capacity` tokens (older text is overwritten, so memory is
//! fixed); documents are separated so no match or continuation crosses from one into the next.
//! For each indexed n-gram length, a hash table holds the latest position that ends such an
//! n-gram and a per-position link to the previous one with the same hash (zlib's hash
//! chains); a lookup walks at most [`CHAIN_STEPS`] links and checks every candidate's tokens,
//! so hash collisions and overwritten text are never matched. Memory: 4 + 8 · orders bytes per
//! token of capacity, plus 8 · orders bytes per table slot.

use crate::types::TokenId;

const NONE: u64 = u64::MAX;
/// Separates documents in the ring.
const SEP: u32 = u32::MAX;
/// Most chain links a lookup follows per n-gram length.
const CHAIN_STEPS: usize = 48;
/// Longest match measured (tokens compared backwards beyond the hashed n-gram).
const MAX_MATCH: usize = 32;

/// An earlier occurrence of the committed text's suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match {
    /// Absolute position of the first token after the match.
    pub end: u64,
    /// Tokens that match (at least the hashed n-gram's length).
    pub len: usize,
}

/// A node of [`Continuations`]: its token, parent (`None`: under the committed text) and the
/// share of the matches' weight that continues this way among those reaching its parent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ContNode {
    pub parent: Option<usize>,
    pub token: TokenId,
    pub share: f32,
}

/// What a lookup found: the longest match length, how many matches, and their continuations
/// as a tree (parents first).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Continuations {
    pub longest: usize,
    pub matches: usize,
    pub nodes: Vec<ContNode>,
}

#[derive(Clone, Debug)]
pub struct SuffixIndex {
    capacity: usize,
    /// N-gram lengths indexed, ascending.
    orders: Vec<usize>,
    /// The ring of tokens (grows to `capacity`).
    toks: Vec<u32>,
    /// Absolute position of the next token.
    next: u64,
    /// Tokens since the last document separator.
    doc_len: usize,
    /// Per order: hash → the latest end (exclusive) of an n-gram with that hash.
    heads: Vec<Vec<u64>>,
    /// Per order, per ring slot: the previous end with the same hash as the n-gram ending at
    /// that slot's token.
    prev: Vec<Vec<u64>>,
    table_mask: u64,
}

fn hash(gram: impl Iterator<Item = u32>) -> u64 {
    // FNV-1a over the tokens, then a final mix.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for t in gram {
        h ^= t as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 29;
    h.wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ (h >> 32)
}

impl SuffixIndex {
    /// An index of at most `capacity` tokens over the n-gram lengths `orders` (e.g. 1, 2, 4).
    pub fn new(capacity: usize, orders: &[usize]) -> Self {
        let mut orders: Vec<usize> = orders.iter().copied().filter(|&n| n > 0).collect();
        orders.sort_unstable();
        orders.dedup();
        let capacity = capacity.max(1);
        let slots = capacity.next_power_of_two().clamp(1 << 8, 1 << 22);
        SuffixIndex {
            capacity,
            toks: Vec::new(),
            next: 0,
            doc_len: 0,
            heads: vec![Vec::new(); orders.len()],
            prev: vec![Vec::new(); orders.len()],
            orders,
            table_mask: slots as u64 - 1,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Tokens held (separators included).
    pub fn len(&self) -> usize {
        self.toks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.toks.is_empty()
    }

    /// Bytes the index holds.
    pub fn bytes(&self) -> usize {
        self.toks.capacity() * 4
            + self
                .heads
                .iter()
                .chain(self.prev.iter())
                .map(|v| v.capacity() * 8)
                .sum::<usize>()
    }

    fn slot(&self, pos: u64) -> usize {
        (pos % self.capacity as u64) as usize
    }

    /// Whether absolute position `pos` still holds its token.
    fn live(&self, pos: u64) -> bool {
        pos < self.next && self.next - pos <= self.capacity as u64
    }

    fn tok(&self, pos: u64) -> u32 {
        self.toks[self.slot(pos)]
    }

    fn put(&mut self, t: u32) {
        let s = self.slot(self.next);
        if self.toks.len() < self.capacity {
            self.toks.push(t);
            for p in self.prev.iter_mut() {
                p.push(NONE);
            }
        } else {
            self.toks[s] = t;
            for p in self.prev.iter_mut() {
                p[s] = NONE;
            }
        }
        self.next += 1;
    }

    /// Appends `tokens` to the current document.
    pub fn extend(&mut self, tokens: &[TokenId]) {
        for &t in tokens {
            if t.0 == SEP {
                continue;
            }
            self.put(t.0);
            self.doc_len += 1;
            let end = self.next;
            let last = self.slot(end - 1);
            for o in 0..self.orders.len() {
                let n = self.orders[o];
                if self.doc_len < n {
                    continue;
                }
                if self.heads[o].is_empty() {
                    self.heads[o] = vec![NONE; self.table_mask as usize + 1];
                }
                let h =
                    (hash((end - n as u64..end).map(|p| self.tok(p))) & self.table_mask) as usize;
                self.prev[o][last] = self.heads[o][h];
                self.heads[o][h] = end;
            }
        }
    }

    /// Ends the current document: later text never continues it.
    pub fn end_document(&mut self) {
        if self.doc_len > 0 {
            self.put(SEP);
            self.doc_len = 0;
        }
    }

    /// How many tokens before `end` match the end of `ctx` (at most [`MAX_MATCH`]).
    fn match_len(&self, end: u64, ctx: &[TokenId]) -> usize {
        let mut l = 0;
        while l < MAX_MATCH.min(ctx.len()) && end > l as u64 {
            let p = end - 1 - l as u64;
            if !self.live(p) || self.tok(p) != ctx[ctx.len() - 1 - l].0 {
                break;
            }
            l += 1;
        }
        l
    }

    /// Earlier occurrences of the longest indexed suffix of `ctx` that some text follows,
    /// longest match first (then latest), at most `max`.
    pub fn matches(&self, ctx: &[TokenId], max: usize) -> Vec<Match> {
        let mut out: Vec<Match> = Vec::with_capacity(CHAIN_STEPS);
        for o in (0..self.orders.len()).rev() {
            let n = self.orders[o];
            if ctx.len() < n || self.heads[o].is_empty() {
                continue;
            }
            let gram = ctx[ctx.len() - n..].iter().map(|t| t.0);
            let mut at = self.heads[o][(hash(gram) & self.table_mask) as usize];
            for _ in 0..CHAIN_STEPS {
                if at == NONE || !self.live(at - 1) {
                    break;
                }
                // Something must follow the match (not the end of the text or a document).
                if at < self.next && self.tok(at) != SEP {
                    // Checked token by token: hash collisions and overwritten text fail here.
                    let len = self.match_len(at, ctx);
                    if len >= n {
                        out.push(Match { end: at, len });
                    }
                }
                let before = self.prev[o][self.slot(at - 1)];
                if before >= at {
                    break; // a link from text that has been overwritten
                }
                at = before;
            }
            if !out.is_empty() {
                break;
            }
        }
        out.sort_by(|a, b| b.len.cmp(&a.len).then(b.end.cmp(&a.end)));
        out.truncate(max);
        out
    }

    /// The continuations of up to `max_matches` matches of `ctx`'s suffix, `depth` tokens deep
    /// at most, as a tree; each match weighs its match length, so longer matches lead.
    pub fn continuations(
        &self,
        ctx: &[TokenId],
        max_matches: usize,
        depth: usize,
    ) -> Continuations {
        let ms = self.matches(ctx, max_matches);
        let room = ms.len() * depth;
        let mut nodes: Vec<ContNode> = Vec::with_capacity(room);
        let mut weight: Vec<f32> = Vec::with_capacity(room);
        // Depth by depth: each match still going sits at a node; matches that read the same
        // token under the same node share the child (at most `max_matches` per depth).
        let mut at: Vec<(usize, Option<usize>)> = (0..ms.len()).map(|i| (i, None)).collect();
        let mut level: Vec<(Option<usize>, u32, usize)> = Vec::with_capacity(ms.len());
        for d in 0..depth as u64 {
            level.clear();
            at.retain_mut(|(m, node)| {
                let p = ms[*m].end + d;
                if !self.live(p) || self.tok(p) == SEP {
                    return false;
                }
                let t = self.tok(p);
                let i = match level.iter().find(|e| e.0 == *node && e.1 == t) {
                    Some(e) => e.2,
                    None => {
                        nodes.push(ContNode {
                            parent: *node,
                            token: TokenId(t),
                            share: 0.0,
                        });
                        weight.push(0.0);
                        level.push((*node, t, nodes.len() - 1));
                        nodes.len() - 1
                    }
                };
                weight[i] += ms[*m].len as f32;
                *node = Some(i);
                true
            });
            if at.is_empty() {
                break;
            }
        }
        let total: f32 = ms.iter().map(|m| m.len as f32).sum();
        for i in 0..nodes.len() {
            let above = match nodes[i].parent {
                Some(p) => weight[p],
                None => total,
            };
            nodes[i].share = if above > 0.0 { weight[i] / above } else { 0.0 };
        }
        Continuations {
            longest: ms.first().map_or(0, |m| m.len),
            matches: ms.len(),
            nodes,
        }
    }
}

/// What `paradraft ngram suffix-bench` reports: microseconds per lookup (the continuations
/// of up to 8 matches, 24 deep, as `auto` asks each round) after each of `contexts`' prefixes of
/// `len` tokens, cycling over them `queries` times; and the share of lookups that found a match.
pub fn bench_lookups(
    ix: &SuffixIndex,
    contexts: &[TokenId],
    len: usize,
    queries: usize,
) -> (f64, f64) {
    let n = queries.max(1);
    let span = contexts.len().saturating_sub(len).max(1);
    let mut found = 0usize;
    let t = std::time::Instant::now();
    for q in 0..n {
        let at = (q * 7919) % span;
        let ctx = &contexts[at..(at + len).min(contexts.len())];
        found += (!ix.continuations(ctx, 8, 24).nodes.is_empty()) as usize;
    }
    (
        t.elapsed().as_secs_f64() * 1e6 / n as f64,
        found as f64 / n as f64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u32]) -> Vec<TokenId> {
        v.iter().map(|&t| TokenId(t)).collect()
    }

    /// The longest match leads; shares are the matches' weight split at each branch.
    #[test]
    fn continuations_follow_the_longest_matches() {
        let mut ix = SuffixIndex::new(1000, &[1, 2, 4]);
        ix.extend(&ids(&[5, 1, 2, 3, 4, 9, 1, 2, 7, 8, 6, 1, 2]));
        // Suffix [6, 1, 2]... the 2-gram [1, 2] occurs at 1..3 (→ 3) and 6..8 (→ 7); the
        // occurrence at the very end has nothing after it.
        let c = ix.continuations(&ids(&[6, 1, 2]), 8, 2);
        assert_eq!(c.matches, 2);
        assert_eq!(c.longest, 2);
        let first: Vec<(u32, f32)> = c
            .nodes
            .iter()
            .filter(|n| n.parent.is_none())
            .map(|n| (n.token.0, n.share))
            .collect();
        assert_eq!(first, vec![(7, 0.5), (3, 0.5)], "latest first among equals");
        // A longer match wins the weight: [9, 1, 2] matches 3 tokens at 5..8.
        let c = ix.continuations(&ids(&[9, 1, 2]), 8, 3);
        assert_eq!(c.longest, 3);
        assert_eq!(c.nodes[0].token.0, 7);
        assert!((c.nodes[0].share - 0.6).abs() < 1e-6, "{:?}", c.nodes);
        let child = |p: usize| c.nodes.iter().position(|n| n.parent == Some(p)).unwrap();
        let (eight, six) = (child(0), child(child(0)));
        assert_eq!((c.nodes[eight].token.0, c.nodes[six].token.0), (8, 6));
        assert_eq!(c.nodes[eight].share, 1.0);
        let parents_first = c.nodes.iter().enumerate();
        assert!(parents_first
            .clone()
            .all(|(i, n)| n.parent.is_none_or(|p| p < i)));
        assert!(ix.continuations(&ids(&[42]), 8, 3).nodes.is_empty());
    }

    /// Nothing crosses a document boundary; overwritten text is never matched; memory is
    /// fixed by the capacity.
    #[test]
    fn documents_and_the_ring_bound_what_matches() {
        let mut ix = SuffixIndex::new(16, &[1, 2]);
        ix.extend(&ids(&[1, 2, 3]));
        ix.end_document();
        ix.extend(&ids(&[4, 1, 2]));
        let c = ix.continuations(&ids(&[1, 2]), 8, 4);
        let toks: Vec<u32> = c.nodes.iter().map(|n| n.token.0).collect();
        assert_eq!(toks, vec![3], "stops at the separator: {toks:?}");
        ix.end_document();
        ix.extend(&ids(&[3]));
        // "2 3" ends a document: after [2] the only continuation is 3, then nothing.
        let c = ix.continuations(&ids(&[2]), 8, 4);
        assert_eq!(c.nodes.len(), 1);
        // Fill the ring past its capacity: the first document is gone.
        let bytes = ix.bytes();
        for i in 0..40 {
            ix.extend(&ids(&[100 + i]));
        }
        assert_eq!(ix.len(), 16);
        assert!(ix.continuations(&ids(&[1, 2]), 8, 4).nodes.is_empty());
        assert!(ix.bytes() <= bytes.max(16 * 4 + 2 * (16 * 8 + 256 * 8)));
        let c = ix.continuations(&ids(&[130]), 8, 2);
        let toks: Vec<u32> = c.nodes.iter().map(|n| n.token.0).collect();
        assert_eq!(toks, vec![131, 132]);
    }

    /// Against a brute-force scan: the same set of match ends on random text with few symbols.
    #[test]
    fn matches_equal_a_brute_force_scan() {
        let mut x: u64 = 7;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 5) as u32
        };
        let text: Vec<TokenId> = (0..400).map(|_| TokenId(rnd())).collect();
        let mut ix = SuffixIndex::new(10_000, &[3]);
        ix.extend(&text);
        for end in [10usize, 57, 200, 399] {
            let ctx = &text[..end];
            let mut got: Vec<u64> = ix.matches(ctx, 1000).iter().map(|m| m.end).collect();
            got.sort_unstable();
            let want: Vec<u64> = (3..text.len())
                .filter(|&e| text[e - 3..e] == ctx[ctx.len() - 3..])
                .map(|e| e as u64)
                .collect();
            assert!(!want.is_empty() && want.len() < CHAIN_STEPS);
            assert_eq!(got, want, "context end {end}");
        }
    }
}
