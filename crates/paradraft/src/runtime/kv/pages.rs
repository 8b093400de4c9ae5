//! A pool of KV pages shared by many caches (`serve`'s `--kv-memory-mib`): one set of buffers
//! laid out as one cache of `pages × 16` slots, handed out a page (16 slots of every layer and
//! KV head: one K tile) at a time. A paged [`KvCache`](super::KvCache) maps its slots to pages
//! through its page table, takes pages as it grows, gives them back as it truncates or drops,
//! and shares pages with other caches (a cached prefix) by reference count, copying a shared
//! page before it writes into it.
//!
//! Sharing rule (what makes the unsynchronised buffers sound): a cache writes only into pages
//! it holds alone (it copies a shared page first, [`KvCache::reserve`](super::KvCache::reserve)),
//! and every cache of a pool is used from one thread at a time (the engine's), writes and
//! reads of one forward never overlapping (each layer writes every sequence's rows, then
//! attends).

use super::store::{Bufs, Geom, Store};
use super::{KvDtype, KV_TILE, MAX_HEAD_DIM};
use std::cell::UnsafeCell;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

/// Pages per allocation group: a cache that starts a new group of its tiles takes a group
/// whose pages are all free, and its next tiles take the pages after its last one, so a
/// sequence's K/V lies in runs of up to 8 pages (128 slots: 16 KiB of an f16 head's K) even
/// when many sequences grow at once. Attention streams such runs; scattered 2 KiB tiles made
/// 16 decode rows over 2,000 cached tokens 50 % slower (`paged_decode_timing`).
const GROUP: usize = 8;

pub struct PagePool {
    store: UnsafeCell<Store>,
    geom: Geom,
    layers: usize,
    dtype: KvDtype,
    state: Mutex<State>,
}

/// Each page's holders, the free pages, the groups of [`GROUP`] pages all free, and each
/// group's free pages.
struct State {
    refs: Vec<u32>,
    free: BTreeSet<u32>,
    whole: BTreeSet<u32>,
    group_free: Vec<u8>,
}

impl State {
    fn new(pages: usize) -> Self {
        let mut s = State {
            refs: vec![0; pages],
            free: BTreeSet::new(),
            whole: BTreeSet::new(),
            group_free: vec![0; pages.div_ceil(GROUP)],
        };
        for p in 0..pages as u32 {
            s.put(p);
        }
        s
    }

    /// Pages in group `g` (the last one may be short).
    fn group_len(&self, g: usize) -> u8 {
        GROUP.min(self.refs.len() - g * GROUP) as u8
    }

    /// Page `p` (free) is taken, held once.
    fn take(&mut self, p: u32) {
        let g = p as usize / GROUP;
        if self.group_free[g] == self.group_len(g) {
            self.whole.remove(&(g as u32));
        }
        self.group_free[g] -= 1;
        self.free.remove(&p);
        self.refs[p as usize] = 1;
    }

    /// Page `p` is free.
    fn put(&mut self, p: u32) {
        let g = p as usize / GROUP;
        self.free.insert(p);
        self.group_free[g] += 1;
        if self.group_free[g] == self.group_len(g) {
            self.whole.insert(g as u32);
        }
    }
}

// SAFETY: the buffers are written only under the sharing rule above (one writer per page, no
// reads of a page while it is written); the bookkeeping is behind a mutex.
unsafe impl Sync for PagePool {}

impl PagePool {
    /// A pool of `pages` pages for caches of this geometry and element type (at most 2³²/16
    /// pages; its memory is mapped as pages are first written).
    pub fn new(
        n_layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        pages: usize,
        dtype: KvDtype,
    ) -> crate::error::Result<Arc<Self>> {
        if head_dim > MAX_HEAD_DIM || pages == 0 || pages > (u32::MAX as usize) / KV_TILE {
            return Err(crate::error::Error::BadRequest(format!(
                "a KV page pool of {pages} pages (head size {head_dim}): expected 1 to {} pages, head size up to {MAX_HEAD_DIM}",
                (u32::MAX as usize) / KV_TILE
            )));
        }
        let geom = Geom {
            n_kv_heads,
            head_dim,
            capacity: pages * KV_TILE,
        };
        let store = match dtype {
            KvDtype::F32 => Store::F32(Bufs::new(n_layers, geom)),
            KvDtype::F16 => Store::F16(Bufs::new(n_layers, geom)),
            KvDtype::Q8_0 => Store::Q8(Bufs::new(n_layers, geom)),
        };
        Ok(Arc::new(PagePool {
            store: UnsafeCell::new(store),
            geom,
            layers: n_layers,
            dtype,
            state: Mutex::new(State::new(pages)),
        }))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state stays consistent even if a holder panicked (each change is one statement).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pages in all.
    pub fn pages(&self) -> usize {
        self.geom.capacity / KV_TILE
    }

    /// Pages no cache holds.
    pub fn free_pages(&self) -> usize {
        self.state().free.len()
    }

    /// `(layers, KV heads, head dim)` of the caches it serves.
    pub fn geometry(&self) -> (usize, usize, usize) {
        (self.layers, self.geom.n_kv_heads, self.geom.head_dim)
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    pub(super) fn geom(&self) -> Geom {
        self.geom
    }

    /// The buffers, to read.
    ///
    /// # Safety
    /// No page read through it is written while the reference lives (the sharing rule).
    pub(super) unsafe fn store(&self) -> &Store {
        &*self.store.get()
    }

    /// The buffers, to write.
    ///
    /// # Safety
    /// Only pages the caller holds alone are written, and nothing reads them meanwhile.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn store_mut(&self) -> &mut Store {
        &mut *self.store.get()
    }

    /// A free page, now held once (None: none is free): `after`'s successor if it is free
    /// (a sequence's next tile beside its last one), else the first page of a group all free,
    /// else any.
    pub(super) fn take(&self, after: Option<u32>) -> Option<u32> {
        let mut s = self.state();
        let next = after.map(|p| p as usize + 1);
        let p = match next {
            Some(n) if n < s.refs.len() && s.refs[n] == 0 => n as u32,
            _ => match s.whole.first() {
                Some(&g) => g * GROUP as u32,
                None => *s.free.first()?,
            },
        };
        s.take(p);
        Some(p)
    }

    /// One more holder of page `p`.
    pub(super) fn retain(&self, p: u32) {
        self.state().refs[p as usize] += 1;
    }

    /// One holder fewer of page `p`; free when none is left.
    pub(super) fn release(&self, p: u32) {
        let mut s = self.state();
        let r = &mut s.refs[p as usize];
        debug_assert!(*r > 0, "page {p} released more often than held");
        if *r > 0 {
            *r -= 1;
            if *r == 0 {
                s.put(p);
            }
        }
    }

    /// How many distinct pages of `tables` (page tables of this pool's caches) no cache
    /// outside them holds: what dropping all those caches frees.
    pub(super) fn held_only_by(&self, tables: &[&[u32]]) -> usize {
        let mut holds = std::collections::HashMap::<u32, u32>::new();
        for &p in tables.iter().flat_map(|t| t.iter()) {
            *holds.entry(p).or_default() += 1;
        }
        let s = self.state();
        holds
            .iter()
            .filter(|&(&p, &n)| s.refs[p as usize] == n)
            .count()
    }

    /// Whether another cache holds page `p` too.
    pub(super) fn shared(&self, p: u32) -> bool {
        self.state().refs[p as usize] > 1
    }
}

impl PagePool {
    /// Gives the memory of free pages back to the operating system (read back as zeros, a
    /// valid value of every element type, when next taken): each run of free pages is a
    /// contiguous range in every K, V and scale buffer, of which the whole memory pages inside
    /// are released. For an idle server, whose pool filled during a burst.
    pub fn trim(&self) {
        let s = self.state();
        // Runs of free pages: (first, end).
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for (p, _) in s.refs.iter().enumerate().filter(|(_, &r)| r == 0) {
            match runs.last_mut() {
                Some(run) if run.1 == p => run.1 = p + 1,
                _ => runs.push((p, p + 1)),
            }
        }
        let g = self.geom;
        // Each buffer of each layer: per KV head, a run of pages is one range.
        fn each_run<T>(bufs: &mut [Vec<T>], g: Geom, runs: &[(usize, usize)]) {
            for buf in bufs {
                let per = buf.len() / (g.n_kv_heads * g.tiles());
                for h in 0..g.n_kv_heads {
                    for &run in runs {
                        release(&mut buf[g.pages_span(h, run, per)]);
                    }
                }
            }
        }
        // SAFETY: only free pages' memory is released, under the state lock (no cache takes
        // one meanwhile), and no cache reads or writes a free page.
        super::store::each!(unsafe { self.store_mut() }, b => {
            each_run(&mut b.k, g, &runs);
            each_run(&mut b.v, g, &runs);
            each_run(&mut b.ks, g, &runs);
            each_run(&mut b.vs, g, &runs);
        });
    }

    /// Copies page `old` to page `new` in every layer (copy-on-write).
    ///
    /// # Safety
    /// The caller holds page `new` alone; `old` is only read.
    pub(super) unsafe fn copy_page(&self, old: u32, new: u32) {
        let g = self.geom;
        super::store::each!(self.store_mut(), b => {
            for li in 0..b.k.len() {
                g.copy_page(&mut b.layer_mut(li), old as usize, new as usize);
            }
        });
    }
}

/// Releases the whole memory pages inside `x` (anonymous memory: they read back as zeros).
fn release<T>(x: &mut [T]) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let a = x.as_mut_ptr() as usize;
        let b = a + std::mem::size_of_val(x);
        let (a, b) = (a.next_multiple_of(PAGE), b / PAGE * PAGE);
        if b > a {
            // SAFETY: [a, b) lies inside `x`, whose values nobody reads before writing them
            // again (free pages), and zero bytes are a valid value of the cache's types.
            unsafe {
                libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_DONTNEED);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = x.len();
}
