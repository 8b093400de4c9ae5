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

use crate::kv::KvCache;
use crate::types::TokenId;

/// The shortest reuse worth a copy.
pub const MIN_HIT: usize = 8;

struct Entry {
    tokens: Vec<TokenId>,
    kv: KvCache,
    hidden: Vec<f32>,
    bytes: usize,
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
    used: usize,
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
            used: 0,
            clock: 0,
            evictions: 0,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.used
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
        self.used -= self.entries.swap_remove(lru).bytes;
        self.evictions += 1;
        true
    }

    /// Pages of the pool that evicting every entry would give back (pages that running
    /// requests or two entries share are not counted).
    pub fn freeable_pages(&self) -> usize {
        self.entries.iter().map(|e| e.kv.sole_pages()).sum()
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

    /// Keeps `prompt`'s K/V (the first `prompt.len()` slots of `kv`) and tapped states. An
    /// entry that is a prefix of it is replaced; one it is a prefix of makes it redundant.
    pub fn insert(&mut self, prompt: &[TokenId], kv: &KvCache, hidden: &[f32]) {
        if self.budget == 0 || prompt.len() < MIN_HIT || kv.len() < prompt.len() {
            return;
        }
        if self.entries.iter().any(|e| e.tokens.starts_with(prompt)) {
            return;
        }
        let bytes = prompt.len() * kv.bytes_per_slot() + std::mem::size_of_val(hidden);
        if bytes > self.budget {
            return;
        }
        let Ok(snapshot) = kv.prefix(prompt.len()) else {
            return;
        };
        self.entries.retain(|e| !prompt.starts_with(&e.tokens));
        self.used = self.entries.iter().map(|e| e.bytes).sum();
        while self.used + bytes > self.budget && self.evict_lru() {}
        self.clock += 1;
        self.entries.push(Entry {
            tokens: prompt.to_vec(),
            kv: snapshot,
            hidden: hidden.to_vec(),
            bytes,
            used: self.clock,
        });
        self.used += bytes;
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
}
