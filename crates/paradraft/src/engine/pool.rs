//! The KV memory of all requests: one pool of pages of 16 slots (the attention's K tiles),
//! `--kv-memory-mib` in all. A request's cache takes pages as it grows and gives them back as
//! it truncates or ends; a cached prefix lends its pages to the requests that begin with it
//! (copied before either writes into a shared page). A request is admitted when the free pages
//! beyond what the next step may take cover its prompt and one round (less the whole pages a
//! cached prefix lends it) and its drafter's own cache; before each step the scheduler makes
//! room for the step's rows, evicting cached prefixes and then preempting the requests that
//! arrived last (vLLM's recompute preemption: the pages go back, the session waits and rebuilds
//! its cache from its tokens when readmitted, its output unchanged).

use crate::kv::{KvCache, PagePool, KV_TILE};
use std::sync::Arc;

/// Slots per page.
pub const PAGE_SLOTS: usize = KV_TILE;

pub struct KvPool {
    pages: Arc<PagePool>,
}

impl KvPool {
    /// A pool of `total` pages for `model`'s K/V.
    pub fn new(model: &crate::model::Model, total: usize) -> crate::error::Result<Self> {
        Ok(KvPool {
            pages: model.new_kv_pool(total)?,
        })
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

    /// An empty cache of up to `capacity` slots in this pool.
    pub fn cache(&self, capacity: usize) -> KvCache {
        KvCache::paged(&self.pages, capacity)
    }

    /// Pages no cache holds.
    pub fn free(&self) -> usize {
        self.pages.free_pages()
    }

    pub fn total(&self) -> usize {
        self.pages.pages()
    }

    /// Gives the memory of free pages back to the operating system (an idle server's).
    pub fn trim(&self) {
        self.pages.trim();
    }
}
