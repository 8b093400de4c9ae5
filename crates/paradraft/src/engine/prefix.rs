//! Shared-prefix cache: the K/V (and the drafter's tapped states) of recent prompts, so a
//! request that begins with the same tokens — a system prompt, a chat history, few-shot
//! examples — reuses them instead of prefilling them (in the server's page pool an entry
//! shares the prompt's pages and a hit shares the entry's: copy-on-write, no copy up front). Entries are whole prompts keyed by their
//! tokens (one engine serves one model and one drafter set, so tokens are the whole key); a
//! request reuses the longest common prefix with any entry. Least recently used entries go
//! first when the byte budget is exceeded.
//!
//! Exact: a prefix's K/V and states do not depend on what follows it nor on the batch that
//! computed them (the forward's batch invariance), so a hit changes no output.

use crate::kv::{KvCache, KV_TILE};
use crate::types::TokenId;

/// The shortest reuse worth a copy.
pub const MIN_HIT: usize = 8;

struct Entry {
    tokens: Vec<TokenId>,
    kv: KvCache,
    hidden: Vec<f32>,
    used: u64,
}

/// A hit: this many leading tokens of the prompt, with their K/V and tapped states.
pub struct Hit<'c> {
    pub tokens: usize,
    pub kv: &'c KvCache,
    /// `tokens × width` tapped states (the entry holds its whole prompt's).
    pub hidden: &'c [f32],
}

/// The cache, within `budget` bytes (0: off).
pub struct PrefixCache {
    entries: Vec<Entry>,
    budget: usize,
    clock: u64,
    pub evictions: u64,
}

/// Leading tokens `a` and `b` share.
pub fn common(a: &[TokenId], b: &[TokenId]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    pub fn new(budget: usize) -> Self {
        PrefixCache {
            entries: Vec::new(),
            budget,
            clock: 0,
            evictions: 0,
        }
    }

    /// Bytes the entries keep: their tokens and tapped states, and their K/V — of a paged
    /// cache the pool pages only entries hold (pages a running request shares are counted as
    /// that request's, so a prefix in use costs the cache nothing more).
    pub fn bytes(&self) -> usize {
        let pages = self.freeable_pages()
            * self
                .entries
                .first()
                .map_or(0, |e| KV_TILE * e.kv.bytes_per_slot());
        let rest: usize = self
            .entries
            .iter()
            .map(|e| {
                let kv = if e.kv.is_paged() {
                    0
                } else {
                    e.tokens.len() * e.kv.bytes_per_slot()
                };
                kv + std::mem::size_of_val(&e.tokens[..]) + std::mem::size_of_val(&e.hidden[..])
            })
            .sum();
        pages + rest
    }

    /// How many leading tokens of `prompt` a lookup would reuse now (0: none).
    pub fn hit_len(&self, prompt: &[TokenId]) -> usize {
        let limit = prompt.len().saturating_sub(1);
        let n = self
            .entries
            .iter()
            .map(|e| common(&e.tokens, prompt).min(limit))
            .max()
            .unwrap_or(0);
        if n >= MIN_HIT {
            n
        } else {
            0
        }
    }

    /// Drops the least recently used entry (false: none is left). An entry of a paged cache
    /// gives its pages back to the pool unless requests still share them.
    pub fn evict_lru(&mut self) -> bool {
        let Some(lru) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].used) else {
            return false;
        };
        self.entries.swap_remove(lru);
        self.evictions += 1;
        true
    }

    /// Evicts least recently used entries until what they keep fits the budget (the pages of
    /// a prefix become the cache's alone when the last request sharing them ends).
    pub fn fit(&mut self) {
        while self.bytes() > self.budget && self.evict_lru() {}
    }

    /// Pages of the pool that evicting every entry would give back (pages running requests
    /// share are not counted; pages two entries share count once).
    pub fn freeable_pages(&self) -> usize {
        let kvs: Vec<&KvCache> = self.entries.iter().map(|e| &e.kv).collect();
        KvCache::pages_held_only_by(&kvs)
    }

    /// Whether `budget` allows entries at all.
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// The longest cached prefix of `prompt`, leaving its last token to compute (its logits
    /// give the first output token); `width` floats of states per token.
    pub fn lookup(&mut self, prompt: &[TokenId], width: usize) -> Option<Hit<'_>> {
        let limit = prompt.len().saturating_sub(1);
        let (i, n) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common(&e.tokens, prompt).min(limit)))
            .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)))?;
        if n < MIN_HIT || self.entries[i].hidden.len() < n * width {
            return None;
        }
        self.clock += 1;
        let e = &mut self.entries[i];
        e.used = self.clock;
        Some(Hit {
            tokens: n,
            kv: &e.kv,
            hidden: &e.hidden[..n * width],
        })
    }

    /// Keeps `prompt`'s K/V (the first `prompt.len()` slots of `kv`) and tapped states
    /// (`hidden`: the same number of floats for every token). An entry that is a prefix of it
    /// is replaced; one it is a prefix of makes it redundant. A prompt whose whole K/V would
    /// exceed the budget keeps the longest whole-tile prefix that fits: its leading tokens (a
    /// system prompt, few-shot examples) are what other requests share.
    pub fn insert(&mut self, prompt: &[TokenId], kv: &KvCache, hidden: &[f32]) {
        if self.budget == 0 || prompt.len() < MIN_HIT || kv.len() < prompt.len() {
            return;
        }
        let width = hidden.len() / prompt.len();
        let per_token = kv.bytes_per_slot() + width * std::mem::size_of::<f32>();
        let n = if prompt.len() * per_token <= self.budget {
            prompt.len()
        } else {
            self.budget / per_token.max(1) / KV_TILE * KV_TILE
        };
        if n < MIN_HIT {
            return;
        }
        let (prompt, hidden) = (&prompt[..n], &hidden[..n * width]);
        if self.entries.iter().any(|e| e.tokens.starts_with(prompt)) {
            return;
        }
        let Ok(snapshot) = kv.prefix(n) else {
            return;
        };
        self.entries.retain(|e| !prompt.starts_with(&e.tokens));
        self.clock += 1;
        self.entries.push(Entry {
            tokens: prompt.to_vec(),
            kv: snapshot,
            hidden: hidden.to_vec(),
            used: self.clock,
        });
        // Older entries go first (the new one is the most recently used).
        self.fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u32]) -> Vec<TokenId> {
        v.iter().map(|&t| TokenId(t)).collect()
    }

    fn kv_of(n: usize) -> KvCache {
        let mut kv = KvCache::new(2, 1, 4, 64);
        let s = kv.reserve(n).unwrap();
        for l in 0..2 {
            let k: Vec<f32> = (0..n * 4).map(|i| (i + 100 * l) as f32).collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            kv.write(l, s, &k, &v);
        }
        kv
    }

    #[test]
    fn longest_prefix_hits_and_lru_evicts() {
        let a = ids(&(0..20).collect::<Vec<_>>());
        let mut b = a[..12].to_vec();
        b.extend(ids(&[90, 91, 92]));
        let per = kv_of(20).bytes_per_slot();
        let mut c = PrefixCache::new(30 * per);
        c.insert(&a, &kv_of(20), &[]);
        // b shares 12 tokens with a.
        let h = c.lookup(&b, 0).unwrap();
        assert_eq!(h.tokens, 12);
        let mut into = KvCache::new(2, 1, 4, 32);
        into.copy_from(h.kv, h.tokens).unwrap();
        assert_eq!(into.len(), 12);
        // The whole prompt never hits in full: its last token is left to compute.
        assert_eq!(c.lookup(&a, 0).unwrap().tokens, 19);
        // Too short a common prefix: no hit.
        assert!(c
            .lookup(&ids(&[0, 1, 2, 50, 51, 52, 53, 54, 55]), 0)
            .is_none());
        // A second 20-token prompt exceeds the budget: the least recently used goes.
        let other = ids(&(200..220).collect::<Vec<_>>());
        c.insert(&other, &kv_of(20), &[]);
        assert_eq!(c.evictions, 1);
        assert!(c.lookup(&b, 0).is_none());
        assert!(c.lookup(&other, 0).is_some());
        assert!(c.bytes() <= 30 * per);
    }

    /// A prompt whose K/V exceeds the whole budget keeps its longest whole-tile prefix that
    /// fits (with its tapped states), so requests sharing its leading tokens still hit.
    #[test]
    fn a_prompt_beyond_the_budget_keeps_the_prefix_that_fits() {
        let per = kv_of(1).bytes_per_slot();
        let width = 2;
        let per_token = per + width * 4;
        let mut c = PrefixCache::new(20 * per_token);
        let a = ids(&(0..40).collect::<Vec<_>>());
        let hidden: Vec<f32> = (0..40 * width).map(|i| i as f32).collect();
        c.insert(&a, &kv_of(40), &hidden);
        assert!(c.bytes() <= 20 * per_token);
        let mut b = a[..30].to_vec();
        b.extend(ids(&[90, 91, 92]));
        let h = c.lookup(&b, width).expect("the first 16 tokens are kept");
        assert_eq!(h.tokens, KV_TILE);
        assert_eq!(h.hidden, &hidden[..KV_TILE * width]);
        assert_eq!(h.kv.len(), KV_TILE);
        // A budget below one tile keeps nothing.
        let mut tiny = PrefixCache::new(10 * per_token);
        tiny.insert(&a, &kv_of(40), &hidden);
        assert!(tiny.lookup(&b, width).is_none());
    }

    /// In a page pool an entry costs the cache only the pages no request shares: while the
    /// request that computed a 40-token prompt runs, its entry holds 2 shared pages and its own
    /// copy of the partial third; when the request ends all 3 are the cache's. Pages two
    /// entries share count once, and `fit` evicts when ended requests leave the cache over
    /// its budget.
    #[test]
    fn paged_entries_count_the_pages_only_they_hold() {
        use crate::kv::{KvDtype, PagePool};
        let pool = PagePool::new(2, 1, 4, 32, KvDtype::F32).unwrap();
        let write = |kv: &mut KvCache, n: usize| {
            let s = kv.reserve(n).unwrap();
            for l in 0..2 {
                let k: Vec<f32> = (0..n * 4).map(|i| (i + 7 * l) as f32).collect();
                kv.write(l, s, &k, &k);
            }
        };
        let page = KV_TILE * KvCache::paged(&pool, 1).bytes_per_slot();
        let a = ids(&(0..40).collect::<Vec<_>>());
        let mut req = KvCache::paged(&pool, 64);
        write(&mut req, 40);
        let mut c = PrefixCache::new(1 << 20);
        c.insert(&a, &req, &[]);
        let tokens = 40 * std::mem::size_of::<TokenId>();
        assert_eq!(c.freeable_pages(), 1, "the copied partial page");
        assert_eq!(c.bytes(), page + tokens);
        // A second request continues a's first 32 tokens (two whole pages, shared).
        let mut b = a[..32].to_vec();
        b.extend(ids(&[90, 91, 92, 93, 94, 95, 96, 97]));
        let mut req2 = KvCache::paged(&pool, 64);
        req2.copy_from(c.lookup(&b, 0).unwrap().kv, 32).unwrap();
        write(&mut req2, 8);
        c.insert(&b, &req2, &[]);
        drop((req, req2));
        // 2 pages both entries share (counted once) + each one's third page.
        assert_eq!(c.freeable_pages(), 4);
        assert_eq!(c.bytes(), 4 * page + 2 * tokens);
        c.budget = 3 * page + tokens;
        c.fit();
        assert_eq!((c.evictions, c.freeable_pages()), (1, 3));
        assert!(c.lookup(&b, 0).is_some() && c.bytes() <= c.budget);
    }
}
