//! The target's KV cache: preallocated per layer, append-only during a forward, truncated
//! (chain verification) or gather-compacted (tree verification) afterwards.

use crate::error::{Error, Result};
use crate::types::SlotId;

pub struct KvCache {
    /// Per layer: `[capacity, n_kv_heads, head_dim]`.
    pub(crate) k: Vec<Vec<f32>>,
    pub(crate) v: Vec<Vec<f32>>,
    row: usize,
    capacity: usize,
    len: usize,
}

impl KvCache {
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize, capacity: usize) -> Self {
        let row = n_kv_heads * head_dim;
        KvCache {
            k: (0..n_layers).map(|_| vec![0f32; capacity * row]).collect(),
            v: (0..n_layers).map(|_| vec![0f32; capacity * row]).collect(),
            row,
            capacity,
            len: 0,
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

    pub(crate) fn row(&self) -> usize {
        self.row
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
        let row = self.row;
        for (dst, s) in (keep_prefix..).zip(slots) {
            let src = s.idx();
            if src != dst {
                for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
                    buf.copy_within(src * row..(src + 1) * row, dst * row);
                }
            }
        }
        self.len = keep_prefix + slots.len();
        Ok(())
    }
}
