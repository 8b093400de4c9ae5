//! The cache's buffers and their layout: per layer, K in transposed 16-slot tiles and V in
//! rows, addressed by physical slot (a paged cache maps its slots to pages first, [`phys`]).

use super::{KvElem, KvLayer, KV_TILE, MAX_HEAD_DIM, Q8};
use crate::runtime::ggml::QK;
use half::f16;
use std::ops::Range;

/// Per layer, K as `[n_kv_heads, tiles, head_dim, KV_TILE]` (slot `s`, dimension `d` of KV head
/// `g` at `((g · tiles + s / 16) · head_dim + d) · 16 + s % 16`) and V as
/// `[n_kv_heads, capacity, head_dim]`; for a scaled type (Q8_0) the scales of block `b` of K as
/// `[n_kv_heads, tiles, blocks, KV_TILE]` (a tile's 16 slots side by side, as its values) and of V
/// as `[n_kv_heads, capacity, blocks]`. Unscaled types have no scale buffers.
#[derive(Clone)]
pub(super) struct Bufs<E> {
    pub(super) k: Vec<Vec<E>>,
    pub(super) v: Vec<Vec<E>>,
    pub(super) ks: Vec<Vec<f16>>,
    pub(super) vs: Vec<Vec<f16>>,
}

#[derive(Clone)]
pub(super) enum Store {
    F32(Bufs<f32>),
    F16(Bufs<f16>),
    Q8(Bufs<Q8>),
}

/// `$body` with `$b` bound to the store's buffers, whatever their element type.
macro_rules! each {
    ($store:expr, $b:ident => $body:expr) => {
        match $store {
            Store::F32($b) => $body,
            Store::F16($b) => $body,
            Store::Q8($b) => $body,
        }
    };
}
pub(super) use each;

/// Geometry shared by the typed helpers.
#[derive(Clone, Copy)]
pub(super) struct Geom {
    pub(super) n_kv_heads: usize,
    pub(super) head_dim: usize,
    /// Physical slots (a paged pool's: pages × 16).
    pub(super) capacity: usize,
}

/// One layer's buffers, writable.
pub(super) struct LayerMut<'a, E> {
    k: &'a mut [E],
    v: &'a mut [E],
    ks: &'a mut [f16],
    vs: &'a mut [f16],
}

impl<E: KvElem> Bufs<E> {
    pub(super) fn new(layers: usize, g: Geom) -> Self {
        let nb = E::blocks(g.head_dim);
        let bufs = |n: usize| (0..layers).map(|_| zeroed::<E>(n)).collect();
        let scales = |n: usize| (0..layers).map(|_| zeroed::<f16>(n)).collect();
        let (kn, vn) = (g.k_len(), g.n_kv_heads * g.capacity * g.head_dim);
        let (ksn, vsn) = (kn / g.head_dim * nb, vn / g.head_dim * nb);
        Bufs {
            k: bufs(kn),
            v: bufs(vn),
            ks: if nb > 0 { scales(ksn) } else { vec![] },
            vs: if nb > 0 { scales(vsn) } else { vec![] },
        }
    }

    pub(super) fn layer_mut(&mut self, li: usize) -> LayerMut<'_, E> {
        LayerMut {
            k: &mut self.k[li],
            v: &mut self.v[li],
            ks: self.ks.get_mut(li).map_or(&mut [], |s| s.as_mut_slice()),
            vs: self.vs.get_mut(li).map_or(&mut [], |s| s.as_mut_slice()),
        }
    }

    pub(super) fn layer<'a>(
        &'a self,
        li: usize,
        g: Geom,
        table: &'a [u32],
        slots: usize,
    ) -> KvLayer<'a, E> {
        KvLayer {
            k: &self.k[li],
            v: &self.v[li],
            ks: self.ks.get(li).map_or(&[], |s| s.as_slice()),
            vs: self.vs.get(li).map_or(&[], |s| s.as_slice()),
            tiles: g.tiles(),
            capacity: g.capacity,
            table,
            slots,
        }
    }
}

impl Geom {
    pub(super) fn tiles(self) -> usize {
        self.capacity.div_ceil(KV_TILE)
    }

    /// K values per layer.
    fn k_len(self) -> usize {
        self.n_kv_heads * self.tiles() * KV_TILE * self.head_dim
    }

    #[inline]
    pub(super) fn k_at(self, g: usize, slot: usize) -> usize {
        (g * self.tiles() + slot / KV_TILE) * self.head_dim * KV_TILE + slot % KV_TILE
    }

    /// The first K scale (block 0) of slot `slot` of KV head `g`; block `b`'s is `16 · b` on.
    #[inline]
    pub(super) fn ks_at(self, nb: usize, g: usize, slot: usize) -> usize {
        (g * self.tiles() + slot / KV_TILE) * nb * KV_TILE + slot % KV_TILE
    }

    /// Writes the K/V rows of logical slots `slot0..` (through `table`, [`phys`]).
    pub(super) fn write<E: KvElem>(
        self,
        l: LayerMut<E>,
        table: &[u32],
        slot0: usize,
        k: &[f32],
        v: &[f32],
    ) {
        let (hd, row) = (self.head_dim, self.n_kv_heads * self.head_dim);
        let nb = E::blocks(hd);
        // One head's K row converted at a time, on the stack (no allocation per step).
        let mut kc = [E::default(); MAX_HEAD_DIM];
        let mut sc = [f16::ZERO; MAX_HEAD_DIM / QK];
        for t in 0..k.len() / row {
            let slot = phys(table, slot0 + t);
            for g in 0..self.n_kv_heads {
                E::store(&k[t * row + g * hd..][..hd], &mut kc[..hd], &mut sc[..nb]);
                let base = self.k_at(g, slot);
                for (d, &x) in kc[..hd].iter().enumerate() {
                    l.k[base + d * KV_TILE] = x;
                }
                let sb = self.ks_at(nb, g, slot);
                for (b, &s) in sc[..nb].iter().enumerate() {
                    l.ks[sb + b * KV_TILE] = s;
                }
                let vo = (g * self.capacity + slot) * hd;
                let vso = (g * self.capacity + slot) * nb;
                E::store(
                    &v[t * row + g * hd..][..hd],
                    &mut l.v[vo..vo + hd],
                    &mut l.vs[vso..vso + nb],
                );
            }
        }
    }

    /// Copies physical slot `src` of `from` (of geometry `fg`) to slot `dst` of `to` (of this geometry);
    /// `from` None: within `to`.
    pub(super) fn copy_slot<E: KvElem>(
        self,
        to: &mut LayerMut<E>,
        from: Option<(Geom, &Bufs<E>, usize)>,
        src: usize,
        dst: usize,
    ) {
        let (hd, nb) = (self.head_dim, E::blocks(self.head_dim));
        for g in 0..self.n_kv_heads {
            let (b, bs) = (self.k_at(g, dst), self.ks_at(nb, g, dst));
            let (vb, vsb) = (
                (g * self.capacity + dst) * hd,
                (g * self.capacity + dst) * nb,
            );
            match from {
                None => {
                    let (a, s) = (self.k_at(g, src), self.ks_at(nb, g, src));
                    for d in 0..hd {
                        to.k[b + d * KV_TILE] = to.k[a + d * KV_TILE];
                    }
                    for j in 0..nb {
                        to.ks[bs + j * KV_TILE] = to.ks[s + j * KV_TILE];
                    }
                    let (va, vsa) = (
                        (g * self.capacity + src) * hd,
                        (g * self.capacity + src) * nb,
                    );
                    to.v.copy_within(va..va + hd, vb);
                    to.vs.copy_within(vsa..vsa + nb, vsb);
                }
                Some((fg, bufs, li)) => {
                    let (a, s) = (fg.k_at(g, src), fg.ks_at(nb, g, src));
                    let (k, ks) = (&bufs.k[li], bufs.ks.get(li).map_or(&[][..], |x| x));
                    for d in 0..hd {
                        to.k[b + d * KV_TILE] = k[a + d * KV_TILE];
                    }
                    for j in 0..nb {
                        to.ks[bs + j * KV_TILE] = ks[s + j * KV_TILE];
                    }
                    let (va, vsa) = ((g * fg.capacity + src) * hd, (g * fg.capacity + src) * nb);
                    to.v[vb..vb + hd].copy_from_slice(&bufs.v[li][va..va + hd]);
                    if nb > 0 {
                        to.vs[vsb..vsb + nb].copy_from_slice(&bufs.vs[li][vsa..vsa + nb]);
                    }
                }
            }
        }
    }
}

impl Geom {
    /// Where pages `p0..p1` of KV head `h` lie in one layer's buffer that holds `per` values a
    /// page and head (K and V: head_dim × 16; their scales: blocks × 16). A pool's geometry
    /// (capacity = tiles × 16), where K, V and the scales all hold a page as one run per head.
    pub(super) fn pages_span(self, h: usize, (p0, p1): (usize, usize), per: usize) -> Range<usize> {
        let base = h * self.tiles() * per;
        base + p0 * per..base + p1 * per
    }

    /// Copies page `src` (16 slots of every KV head, scales included) to page `dst` of the same
    /// layer (a paged cache's copy-on-write).
    pub(super) fn copy_page<E: KvElem>(self, l: &mut LayerMut<E>, src: usize, dst: usize) {
        let (vals, scales) = (self.head_dim * KV_TILE, E::blocks(self.head_dim) * KV_TILE);
        for h in 0..self.n_kv_heads {
            let (a, b) = (
                self.pages_span(h, (src, src + 1), vals),
                self.pages_span(h, (dst, dst + 1), vals),
            );
            l.k.copy_within(a.clone(), b.start);
            l.v.copy_within(a, b.start);
            if scales > 0 {
                let (a, b) = (
                    self.pages_span(h, (src, src + 1), scales),
                    self.pages_span(h, (dst, dst + 1), scales),
                );
                l.ks.copy_within(a.clone(), b.start);
                l.vs.copy_within(a, b.start);
            }
        }
    }
}

/// The physical slot of logical slot `slot`: through `table` (the page of each 16-slot tile),
/// itself when `table` is empty (a cache that owns its buffers).
#[inline]
pub(crate) fn phys(table: &[u32], slot: usize) -> usize {
    match table.get(slot / KV_TILE) {
        Some(&p) => p as usize * KV_TILE + slot % KV_TILE,
        None => slot,
    }
}

/// `n` zero values, from zeroed memory: the operating system maps its pages when they are
/// first written, so a large page pool costs resident memory only as it fills. (Zero bytes are
/// a valid value of every [`KvElem`]: f32 and f16 0.0, `Q8(0)`.)
fn zeroed<E: Copy>(n: usize) -> Vec<E> {
    let Ok(layout) = std::alloc::Layout::array::<E>(n) else {
        panic!("a KV buffer of {n} values does not fit the address space");
    };
    if layout.size() == 0 {
        return Vec::new();
    }
    // SAFETY: the layout is non-zero-sized; all-zero bytes are a valid E (see above); the
    // vector takes ownership of an allocation of exactly `layout`.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut E;
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Vec::from_raw_parts(p, n, n)
    }
}
