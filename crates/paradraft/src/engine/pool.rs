//! The KV memory of all requests as one pool of fixed-size pages (16 slots: the attention's
//! K tiles). A request reserves the pages of its whole run (prompt, `max_tokens`, one draft)
//! when it is admitted and returns them when it ends, so a running request never waits for
//! memory and admission control is exact: a request waits in the queue until its pages are
//! free (TGI's block reservation, without preemption).

use crate::kv::KV_TILE;

/// Slots per page.
pub const PAGE_SLOTS: usize = KV_TILE;

#[derive(Debug)]
pub struct KvPool {
    total: usize,
    used: usize,
}

impl KvPool {
    /// A pool of `total` pages.
    pub fn new(total: usize) -> Self {
        KvPool { total, used: 0 }
    }

    /// The pages `mib` MiB of memory hold for `model`'s K/V, refused when they cannot hold one
    /// request of the full context (`ctx` tokens).
    pub fn pages_in(
        mib: usize,
        model: &crate::model::Model,
        ctx: usize,
    ) -> crate::error::Result<usize> {
        let page_bytes = PAGE_SLOTS * model.new_kv(1).bytes_per_slot();
        let pages = mib.saturating_mul(1 << 20) / page_bytes;
        if pages < Self::pages_for(ctx) {
            return Err(crate::error::Error::BadRequest(format!(
                "--kv-memory-mib {mib} holds {pages} pages of {page_bytes} bytes, less than one request of the full context ({ctx} tokens); raise it or lower --ctx-size"
            )));
        }
        Ok(pages)
    }

    /// Pages that hold `slots` slots.
    pub fn pages_for(slots: usize) -> usize {
        slots.div_ceil(PAGE_SLOTS)
    }

    /// Reserves `pages` if they are free.
    pub fn try_reserve(&mut self, pages: usize) -> bool {
        if self.used + pages > self.total {
            return false;
        }
        self.used += pages;
        true
    }

    pub fn release(&mut self, pages: usize) {
        debug_assert!(pages <= self.used);
        self.used -= pages.min(self.used);
    }

    pub fn used(&self) -> usize {
        self.used
    }

    pub fn total(&self) -> usize {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_until_full_and_releases() {
        let mut p = KvPool::new(10);
        assert_eq!(KvPool::pages_for(1), 1);
        assert_eq!(KvPool::pages_for(16), 1);
        assert_eq!(KvPool::pages_for(17), 2);
        assert!(p.try_reserve(6));
        assert!(!p.try_reserve(5));
        assert!(p.try_reserve(4));
        assert_eq!(p.used(), 10);
        p.release(6);
        assert!(p.try_reserve(5));
        assert_eq!(p.used(), 9);
    }
}
