//! The target's KV cache: preallocated per layer (or in pages of a shared pool, taken as it
//! grows), append-only during a forward, truncated (chain verification) or gather-compacted
//! (tree verification) afterwards.

mod pages;
mod store;
#[cfg(test)]
pub(crate) mod tests;

pub use pages::PagePool;

use crate::error::{Error, Result};
use crate::runtime::ggml::QK;
use crate::types::SlotId;
use half::f16;
use std::sync::Arc;
pub(crate) use store::phys;
use store::{each, Bufs, Geom, Store};

/// Slots per K tile: K is stored transposed in tiles of this many slots, so attention
/// scores 16 slots with one vector FMA per head dimension.
pub const KV_TILE: usize = 16;

/// Largest head size the cache takes (checked when a model's config is validated).
pub const MAX_HEAD_DIM: usize = 512;

/// Element type of the cache. f16 halves the bytes attention reads (llama.cpp's default);
/// f32 is the reference; q8_0 (llama.cpp's `-ctk q8_0 -ctv q8_0`) stores each KV head's row in
/// blocks of 32 values as int8 with an f16 scale per block, about half of f16's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvDtype {
    #[default]
    F16,
    F32,
    Q8_0,
}

impl std::str::FromStr for KvDtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f16" => Ok(KvDtype::F16),
            "f32" => Ok(KvDtype::F32),
            "q8_0" => Ok(KvDtype::Q8_0),
            _ => Err(format!("KV cache type `{s}`: expected f16, f32 or q8_0")),
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvDtype::F16 => "f16",
            KvDtype::F32 => "f32",
            KvDtype::Q8_0 => "q8_0",
        })
    }
}

impl KvDtype {
    /// Bytes one KV head's K (or V) row of `head_dim` values takes: a Q8_0 block is 32 int8
    /// values and an f16 scale (a head size that is not a multiple of 32 ends in a shorter block).
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            KvDtype::F16 => 2 * head_dim,
            KvDtype::F32 => 4 * head_dim,
            KvDtype::Q8_0 => head_dim + 2 * head_dim.div_ceil(QK),
        }
    }
}

/// Bytes of K and V that one cache slot (one token) takes across all layers.
pub fn bytes_per_slot(
    n_layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    dtype: KvDtype,
) -> usize {
    2 * n_layers * n_kv_heads * dtype.row_bytes(head_dim)
}

/// A value the cache can store.
pub(crate) trait KvElem: Copy + Default + Send + Sync + 'static {
    /// Whether stored values are integers scaled per block of [`QK`] values of a row (the
    /// value is `get() · scale`); otherwise `get()` is the value and there are no scales.
    const SCALED: bool = false;
    /// The stored value as f32 (for a scaled type, before its block's scale).
    fn get(self) -> f32;
    /// Stores a row: `dst[i]` holds `src[i]`, with the scale of each block of [`QK`] values in
    /// `scales` for a scaled type (`scales` is empty for the others).
    fn store(src: &[f32], dst: &mut [Self], scales: &mut [f16]);
    /// Scale blocks per row of `n` values.
    fn blocks(n: usize) -> usize {
        if Self::SCALED {
            n.div_ceil(QK)
        } else {
            0
        }
    }
}
impl KvElem for f32 {
    #[inline(always)]
    fn get(self) -> f32 {
        self
    }
    fn store(src: &[f32], dst: &mut [f32], _: &mut [f16]) {
        dst.copy_from_slice(src);
    }
}

/// A Q8_0 cache value: an int8 of a block of [`QK`] values sharing an f16 scale.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub(crate) struct Q8(pub i8);

impl KvElem for Q8 {
    const SCALED: bool = true;
    #[inline(always)]
    fn get(self) -> f32 {
        self.0 as f32
    }
    /// llama.cpp's reference Q8_0 quantiser, block by block (`runtime::quant::q8_0_block`).
    fn store(src: &[f32], dst: &mut [Q8], scales: &mut [f16]) {
        let mut q = [0i8; QK];
        for ((x, out), s) in src.chunks(QK).zip(dst.chunks_mut(QK)).zip(scales) {
            *s = crate::runtime::quant::q8_0_block(x, &mut q[..x.len()]);
            for (o, &v) in out.iter_mut().zip(&q) {
                *o = Q8(v);
            }
        }
    }
}

impl KvElem for f16 {
    #[inline(always)]
    fn get(self) -> f32 {
        self.to_f32()
    }
    /// f32 → f16 (round to nearest even), vectorised.
    fn store(src: &[f32], dst: &mut [f16], _: &mut [f16]) {
        #[cfg(target_arch = "x86_64")]
        {
            use crate::runtime::isa::{isa, Isa};
            match isa() {
                // SAFETY: the CPU has AVX-512 (and F16C with it).
                Isa::Avx512Vnni | Isa::Amx => return unsafe { f16_avx512(src, dst) },
                // SAFETY: the CPU has AVX2 and F16C.
                Isa::Avx2 | Isa::AvxVnni => return unsafe { f16_avx2(src, dst) },
                Isa::Portable | Isa::NeonDot => {}
            }
        }
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = f16::from_f32(x);
        }
    }
}

/// f32 → f16 (round to nearest even, as `f16::from_f32`), 16 at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn f16_avx512(src: &[f32], dst: &mut [f16]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 16 <= n {
        let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_loadu_ps(src.as_ptr().add(i)));
        _mm256_storeu_si256(dst.as_mut_ptr().add(i) as *mut __m256i, h);
        i += 16;
    }
    for j in i..n {
        dst[j] = f16::from_f32(src[j]);
    }
}

/// f32 → f16 (round to nearest even, as `f16::from_f32`), 8 at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_avx2(src: &[f32], dst: &mut [f16]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
        _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
        i += 8;
    }
    for j in i..n {
        dst[j] = f16::from_f32(src[j]);
    }
}

/// One layer of the cache, read-only (what attention reads). Buffers are indexed by physical
/// slot: a paged cache's slot `s` is at `table[s / 16] · 16 + s % 16` ([`store::phys`]).
#[derive(Clone, Copy)]
pub(crate) struct KvLayer<'a, E> {
    pub k: &'a [E],
    pub v: &'a [E],
    /// A scaled type's K and V scales (empty otherwise).
    pub ks: &'a [f16],
    pub vs: &'a [f16],
    /// K tiles per KV head (physical).
    pub tiles: usize,
    /// V rows per KV head (physical).
    pub capacity: usize,
    /// The page of each 16-slot tile of the sequence (empty: slots are physical).
    pub table: &'a [u32],
    /// Slots the sequence can address.
    pub slots: usize,
}

/// A layer of any element type.
#[derive(Clone, Copy)]
pub(crate) enum KvLayerRef<'a> {
    F32(KvLayer<'a, f32>),
    F16(KvLayer<'a, f16>),
    Q8(KvLayer<'a, Q8>),
}

/// Where a cache's K/V live: its own buffers, or pages of a shared pool.
enum Mem {
    Own(Store),
    Paged(Arc<PagePool>),
}

/// One sequence's K/V: slots `0..len` in use of `capacity`. It owns its buffers
/// ([`KvCache::with_dtype`]) or maps its 16-slot tiles to pages of a [`PagePool`]
/// ([`KvCache::paged`]), taken as it grows.
pub struct KvCache {
    mem: Mem,
    /// The buffers' geometry (a pool's: all its pages).
    geom: Geom,
    /// Paged: the page of each tile in use. Own: empty.
    table: Vec<u32>,
    /// Paged: the first `shared` pages of `table` came from another cache and were not
    /// copied since (the pages a cached prefix lent).
    shared: usize,
    cap: usize,
    len: usize,
}

impl Clone for KvCache {
    /// An owned cache's copy; a paged cache's clone shares its pages (each copied before
    /// either writes into it).
    fn clone(&self) -> Self {
        let mem = match &self.mem {
            Mem::Own(s) => Mem::Own(s.clone()),
            Mem::Paged(pool) => {
                for &p in &self.table {
                    pool.retain(p);
                }
                Mem::Paged(pool.clone())
            }
        };
        KvCache {
            mem,
            geom: self.geom,
            table: self.table.clone(),
            shared: self.table.len(),
            cap: self.cap,
            len: self.len,
        }
    }
}

impl Drop for KvCache {
    fn drop(&mut self) {
        self.release_from(0);
    }
}

impl KvCache {
    /// An f32 cache (the reference type).
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize, capacity: usize) -> Self {
        Self::with_dtype(n_layers, n_kv_heads, head_dim, capacity, KvDtype::F32)
    }

    /// A cache with its own buffers of `capacity` slots.
    pub fn with_dtype(
        n_layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        dtype: KvDtype,
    ) -> Self {
        assert!(
            head_dim <= MAX_HEAD_DIM,
            "head_dim {head_dim} > {MAX_HEAD_DIM}"
        );
        let geom = Geom {
            n_kv_heads,
            head_dim,
            capacity,
        };
        let store = match dtype {
            KvDtype::F32 => Store::F32(Bufs::new(n_layers, geom)),
            KvDtype::F16 => Store::F16(Bufs::new(n_layers, geom)),
            KvDtype::Q8_0 => Store::Q8(Bufs::new(n_layers, geom)),
        };
        KvCache {
            mem: Mem::Own(store),
            geom,
            table: Vec::new(),
            shared: 0,
            cap: capacity,
            len: 0,
        }
    }

    /// An empty cache of up to `capacity` slots in pages of `pool`, taken as it grows.
    pub fn paged(pool: &Arc<PagePool>, capacity: usize) -> Self {
        KvCache {
            mem: Mem::Paged(pool.clone()),
            geom: pool.geom(),
            table: Vec::new(),
            shared: 0,
            cap: capacity,
            len: 0,
        }
    }

    fn store(&self) -> &Store {
        match &self.mem {
            Mem::Own(s) => s,
            // SAFETY: reads of this cache's pages (the sharing rule, `pages.rs`).
            Mem::Paged(p) => unsafe { p.store() },
        }
    }

    /// The buffers to write (only into pages this cache holds alone) and the page table.
    fn store_mut(&mut self) -> (&mut Store, &[u32]) {
        match &mut self.mem {
            Mem::Own(s) => (s, &self.table),
            // SAFETY: this cache writes only pages it holds alone (`reserve` copies shared
            // ones first), from the pool's one thread.
            Mem::Paged(p) => (unsafe { p.store_mut() }, &self.table),
        }
    }

    fn pool(&self) -> Option<&Arc<PagePool>> {
        match &self.mem {
            Mem::Paged(p) => Some(p),
            Mem::Own(_) => None,
        }
    }

    /// `(layers, KV heads, head dim)`.
    pub fn geometry(&self) -> (usize, usize, usize) {
        let g = self.geom;
        (self.n_layers(), g.n_kv_heads, g.head_dim)
    }

    fn n_layers(&self) -> usize {
        each!(self.store(), b => b.k.len())
    }

    /// Bytes of K and V per slot ([`bytes_per_slot`] of this cache's geometry).
    pub fn bytes_per_slot(&self) -> usize {
        let (layers, heads, hd) = self.geometry();
        bytes_per_slot(layers, heads, hd, self.dtype())
    }

    pub fn dtype(&self) -> KvDtype {
        match self.store() {
            Store::F32(..) => KvDtype::F32,
            Store::F16(..) => KvDtype::F16,
            Store::Q8(..) => KvDtype::Q8_0,
        }
    }

    /// Pages of its pool this cache took itself (fresh or copied) and holds: the ones it costs
    /// the pool beyond the pages it was lent (0 for a cache with its own buffers).
    pub fn own_pages(&self) -> usize {
        self.table.len() - self.shared
    }

    /// Pages of their pool that `caches` (paged, of one pool) hold and no other cache does:
    /// what dropping them all gives back (a page two of them share counts once; one a cache
    /// outside them holds, not at all). 0 for caches with their own buffers.
    pub fn pages_held_only_by(caches: &[&KvCache]) -> usize {
        let Some(pool) = caches.iter().find_map(|c| c.pool()) else {
            return 0;
        };
        let tables: Vec<&[u32]> = caches
            .iter()
            .filter(|c| c.pool().is_some_and(|p| Arc::ptr_eq(p, pool)))
            .map(|c| &c.table[..])
            .collect();
        pool.held_only_by(&tables)
    }

    /// Whether its K/V live in pages of a shared pool.
    pub fn is_paged(&self) -> bool {
        self.pool().is_some()
    }

    /// Pages it shares with another cache of its pool at its start (a cached prefix's).
    pub fn lent_pages(&self) -> usize {
        self.shared
    }

    /// Writes the K/V rows (`[n, n_kv_heads, head_dim]` each) of slots `slot0..slot0 + n`
    /// of layer `li` (reserved).
    pub(crate) fn write(&mut self, li: usize, slot0: usize, k: &[f32], v: &[f32]) {
        let g = self.geom;
        debug_assert!(v.len() == k.len());
        debug_assert!(slot0 + k.len() / (g.n_kv_heads * g.head_dim) <= self.addressable());
        let (store, table) = self.store_mut();
        each!(store, b => g.write(b.layer_mut(li), table, slot0, k, v))
    }

    /// Slots with a place in the buffers.
    fn addressable(&self) -> usize {
        match self.mem {
            Mem::Own(_) => self.cap,
            Mem::Paged(_) => self.table.len() * KV_TILE,
        }
    }

    /// Layer `li`, for attention.
    pub(crate) fn layer(&self, li: usize) -> KvLayerRef<'_> {
        let (g, t, n) = (self.geom, &self.table[..], self.addressable());
        match self.store() {
            Store::F32(b) => KvLayerRef::F32(b.layer(li, g, t, n)),
            Store::F16(b) => KvLayerRef::F16(b.layer(li, g, t, n)),
            Store::Q8(b) => KvLayerRef::Q8(b.layer(li, g, t, n)),
        }
    }

    /// Moves slot `src` to slot `dst` in every layer.
    fn move_slot(&mut self, src: usize, dst: usize) {
        let g = self.geom;
        let (store, table) = self.store_mut();
        let (src, dst) = (phys(table, src), phys(table, dst));
        each!(store, b => {
            for li in 0..b.k.len() {
                g.copy_slot(&mut b.layer_mut(li), None, src, dst);
            }
        })
    }

    /// Slots in use (the committed sequence plus any uncommitted new tokens).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Reserves `n` slots after the current ones and returns the first; errors when full (or
    /// when a paged cache's pool has no page left for them).
    pub(crate) fn reserve(&mut self, n: usize) -> Result<usize> {
        let start = self.len;
        if start + n > self.cap {
            return Err(Error::ContextOverflow {
                needed: start + n,
                capacity: self.cap,
            });
        }
        if let Err(e) = self.pages_for(start, start + n) {
            self.release_from(start.div_ceil(KV_TILE));
            return Err(e);
        }
        self.len += n;
        Ok(start)
    }

    /// Pages of its pool that reserving `n` more slots would take now: fresh pages beyond its
    /// own and copies of the shared pages the new slots fall in (0 for a cache with its own
    /// buffers). What a scheduler makes room for before a forward.
    pub fn pages_to_reserve(&self, n: usize) -> usize {
        let Some(pool) = self.pool() else {
            return 0;
        };
        let (from, to) = (self.len, (self.len + n).min(self.cap));
        let need = to.div_ceil(KV_TILE);
        let copies = (from / KV_TILE..need.min(self.table.len()))
            .filter(|&i| pool.shared(self.table[i]))
            .count();
        need.saturating_sub(self.table.len()) + copies
    }

    /// A paged cache: pages for slots `from..to`, each one this cache holds alone (a shared
    /// page among them is copied first, copy-on-write).
    fn pages_for(&mut self, from: usize, to: usize) -> Result<()> {
        let Some(pool) = self.pool().cloned() else {
            return Ok(());
        };
        let need = to.div_ceil(KV_TILE);
        let exhausted = |pool: &PagePool, have: usize| Error::KvPoolFull {
            needed: need - have,
            free: pool.free_pages(),
        };
        for i in from / KV_TILE..need.min(self.table.len()) {
            let old = self.table[i];
            if !pool.shared(old) {
                continue;
            }
            let after = i.checked_sub(1).map(|j| self.table[j]);
            let new = pool.take(after).ok_or_else(|| exhausted(&pool, i))?;
            // SAFETY: page `new` is this cache's alone; `old` is only read.
            unsafe { pool.copy_page(old, new) };
            pool.release(old);
            self.table[i] = new;
            self.shared = self.shared.min(i);
        }
        while self.table.len() < need {
            let p = pool
                .take(self.table.last().copied())
                .ok_or_else(|| exhausted(&pool, self.table.len()))?;
            self.table.push(p);
        }
        Ok(())
    }

    /// A paged cache gives back its pages from tile `tile` on.
    fn release_from(&mut self, tile: usize) {
        if let Mem::Paged(pool) = &self.mem {
            for p in self.table.drain(tile.min(self.table.len())..) {
                pool.release(p);
            }
            self.shared = self.shared.min(self.table.len());
        }
    }

    /// Drops every slot from `len` on (a paged cache gives back the pages beyond).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.release_from(self.len.div_ceil(KV_TILE));
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// A cache of `n` slots holding this one's first `n` (a prompt's K/V, kept for reuse). A
    /// paged cache's prefix shares its whole pages and copies the last, partial one (so
    /// neither ever writes into a page the other reads).
    pub fn prefix(&self, n: usize) -> Result<KvCache> {
        let n = n.min(self.len);
        let (layers, g) = (self.geometry().0, self.geom);
        let Some(pool) = self.pool() else {
            let mut out =
                KvCache::with_dtype(layers, g.n_kv_heads, g.head_dim, n.max(1), self.dtype());
            out.copy_from(self, n)?;
            return Ok(out);
        };
        let mut out = KvCache::paged(pool, n.max(1));
        let whole = n / KV_TILE;
        for &p in &self.table[..whole] {
            pool.retain(p);
        }
        out.table = self.table[..whole].to_vec();
        out.shared = whole;
        if !n.is_multiple_of(KV_TILE) {
            let new = pool
                .take(out.table.last().copied())
                .ok_or(Error::KvPoolFull { needed: 1, free: 0 })?;
            // SAFETY: page `new` is `out`'s alone; `old` is only read.
            unsafe { pool.copy_page(self.table[whole], new) };
            out.table.push(new);
        }
        out.len = n;
        Ok(out)
    }

    /// Replaces this cache's contents by the first `n` slots of `src` (same layers, heads,
    /// head size and element type; any capacities holding `n`). Two caches of one pool share
    /// the pages instead of copying them.
    pub fn copy_from(&mut self, src: &KvCache, n: usize) -> Result<()> {
        if self.geometry() != src.geometry() || self.dtype() != src.dtype() {
            return Err(Error::BadRequest(
                "copying K/V between caches of different shapes or types".into(),
            ));
        }
        if n > src.len || n > self.cap {
            return Err(Error::ContextOverflow {
                needed: n,
                capacity: self.cap.min(src.len),
            });
        }
        self.clear();
        if let (Some(a), Some(b)) = (self.pool(), src.pool()) {
            if Arc::ptr_eq(a, b) {
                let pages = &src.table[..n.div_ceil(KV_TILE)];
                for &p in pages {
                    a.retain(p);
                }
                self.table = pages.to_vec();
                self.shared = pages.len();
                self.len = n;
                return Ok(());
            }
        }
        self.pages_for(0, n)?;
        fn copy<E: KvElem>(
            (a, ta): (Geom, &[u32]),
            (b, tb): (Geom, &[u32]),
            to: &mut Bufs<E>,
            from: &Bufs<E>,
            n: usize,
        ) {
            for li in 0..to.k.len() {
                let mut l = to.layer_mut(li);
                for s in 0..n {
                    a.copy_slot(&mut l, Some((b, from, li)), phys(tb, s), phys(ta, s));
                }
            }
        }
        let (a, b) = (self.geom, src.geom);
        let (from, tb) = (src.store(), &src.table[..]);
        let (to, ta) = self.store_mut();
        match (to, from) {
            (Store::F32(to), Store::F32(from)) => copy((a, ta), (b, tb), to, from, n),
            (Store::F16(to), Store::F16(from)) => copy((a, ta), (b, tb), to, from, n),
            (Store::Q8(to), Store::Q8(from)) => copy((a, ta), (b, tb), to, from, n),
            _ => return Err(Error::BadRequest("K/V element types differ".into())),
        }
        self.len = n;
        Ok(())
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
        self.truncate(keep_prefix + slots.len());
        Ok(())
    }
}
