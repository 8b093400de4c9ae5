//! The target's KV cache: preallocated per layer, append-only during a forward, truncated
//! (chain verification) or gather-compacted (tree verification) afterwards.

use crate::error::{Error, Result};
use crate::types::SlotId;

/// Slots per K tile: K is stored transposed in tiles of this many slots, so attention
/// scores 16 slots with one vector FMA per head dimension.
pub const KV_TILE: usize = 16;

pub struct KvCache {
    /// Per layer, K as `[n_kv_heads, tiles, head_dim, KV_TILE]`: slot `s`, dimension `d` of
    /// KV head `g` sits at `((g · tiles + s / 16) · head_dim + d) · 16 + s % 16`.
    pub(crate) k: Vec<Vec<f32>>,
    /// Per layer, V as `[n_kv_heads, capacity, head_dim]`.
    pub(crate) v: Vec<Vec<f32>>,
    n_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    len: usize,
}

/// One layer of the cache, read-only (what attention reads).
#[derive(Clone, Copy)]
pub(crate) struct KvLayer<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    /// K tiles per KV head.
    pub tiles: usize,
    /// V rows per KV head.
    pub capacity: usize,
}

impl KvCache {
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize, capacity: usize) -> Self {
        let tiles = capacity.div_ceil(KV_TILE);
        KvCache {
            k: (0..n_layers)
                .map(|_| vec![0f32; n_kv_heads * tiles * KV_TILE * head_dim])
                .collect(),
            v: (0..n_layers)
                .map(|_| vec![0f32; n_kv_heads * capacity * head_dim])
                .collect(),
            n_kv_heads,
            head_dim,
            capacity,
            len: 0,
        }
    }

    fn tiles(&self) -> usize {
        self.capacity.div_ceil(KV_TILE)
    }

    #[inline]
    fn k_at(&self, g: usize, slot: usize, d: usize) -> usize {
        ((g * self.tiles() + slot / KV_TILE) * self.head_dim + d) * KV_TILE + slot % KV_TILE
    }

    /// Writes the K/V rows (`[n, n_kv_heads, head_dim]` each) of slots `slot0..slot0 + n`
    /// of layer `li`.
    pub(crate) fn write(&mut self, li: usize, slot0: usize, k: &[f32], v: &[f32]) {
        let (hd, row) = (self.head_dim, self.n_kv_heads * self.head_dim);
        let n = k.len() / row;
        debug_assert!(slot0 + n <= self.capacity && v.len() == k.len());
        for t in 0..n {
            let slot = slot0 + t;
            for g in 0..self.n_kv_heads {
                let src = &k[t * row + g * hd..t * row + (g + 1) * hd];
                let base = self.k_at(g, slot, 0);
                let kl = &mut self.k[li];
                for (d, &x) in src.iter().enumerate() {
                    kl[base + d * KV_TILE] = x;
                }
                let vo = (g * self.capacity + slot) * hd;
                self.v[li][vo..vo + hd]
                    .copy_from_slice(&v[t * row + g * hd..t * row + (g + 1) * hd]);
            }
        }
    }

    /// Layer `li`, for attention.
    pub(crate) fn layer(&self, li: usize) -> KvLayer<'_> {
        KvLayer {
            k: &self.k[li],
            v: &self.v[li],
            tiles: self.tiles(),
            capacity: self.capacity,
        }
    }

    /// Moves slot `src` to slot `dst` in every layer.
    fn move_slot(&mut self, src: usize, dst: usize) {
        let hd = self.head_dim;
        for li in 0..self.k.len() {
            for g in 0..self.n_kv_heads {
                let (a, b) = (self.k_at(g, src, 0), self.k_at(g, dst, 0));
                let kl = &mut self.k[li];
                for d in 0..hd {
                    kl[b + d * KV_TILE] = kl[a + d * KV_TILE];
                }
                let (a, b) = (
                    (g * self.capacity + src) * hd,
                    (g * self.capacity + dst) * hd,
                );
                self.v[li].copy_within(a..a + hd, b);
            }
        }
    }

    /// Slots in use (the committed sequence plus any uncommitted new tokens).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Reserves `n` slots after the current ones and returns the first; errors when full.
    pub(crate) fn reserve(&mut self, n: usize) -> Result<usize> {
        let start = self.len;
        if start + n > self.capacity {
            return Err(Error::ContextOverflow {
                needed: start + n,
                capacity: self.capacity,
            });
        }
        self.len += n;
        Ok(start)
    }

    /// Drops every slot from `len` on.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Keeps slots `0..keep_prefix` and moves `slots` (strictly increasing, all `>= keep_prefix`)
    /// to `keep_prefix..keep_prefix + slots.len()`, dropping the rest: the accepted path of a
    /// tree becomes contiguous.
    pub fn compact(&mut self, keep_prefix: usize, slots: &[SlotId]) -> Result<()> {
        let mut prev = None;
        for s in slots {
            if s.idx() < keep_prefix || s.idx() >= self.len || prev.is_some_and(|p| p >= s.idx()) {
                return Err(Error::BadRequest(format!(
                    "compact: slot {} is not increasing within {keep_prefix}..{}",
                    s.idx(),
                    self.len
                )));
            }
            prev = Some(s.idx());
        }
        for (dst, s) in (keep_prefix..).zip(slots) {
            if s.idx() != dst {
                self.move_slot(s.idx(), dst);
            }
        }
        self.len = keep_prefix + slots.len();
        Ok(())
    }
}
