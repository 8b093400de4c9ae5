//! The target's KV cache: preallocated per layer, append-only during a forward, truncated
//! (chain verification) or gather-compacted (tree verification) afterwards.

use crate::error::{Error, Result};
use crate::runtime::ggml::QK;
use crate::types::SlotId;
use half::f16;

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
                Isa::Avx512Vnni => return unsafe { f16_avx512(src, dst) },
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

/// Per layer, K as `[n_kv_heads, tiles, head_dim, KV_TILE]` (slot `s`, dimension `d` of KV head
/// `g` at `((g · tiles + s / 16) · head_dim + d) · 16 + s % 16`) and V as
/// `[n_kv_heads, capacity, head_dim]`; for a scaled type (Q8_0) the scales of block `b` of K as
/// `[n_kv_heads, tiles, blocks, KV_TILE]` (a tile's 16 slots side by side, as its values) and of V
/// as `[n_kv_heads, capacity, blocks]`. Unscaled types have no scale buffers.
#[derive(Clone)]
struct Bufs<E> {
    k: Vec<Vec<E>>,
    v: Vec<Vec<E>>,
    ks: Vec<Vec<f16>>,
    vs: Vec<Vec<f16>>,
}

#[derive(Clone)]
enum Store {
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

#[derive(Clone)]
pub struct KvCache {
    store: Store,
    geom: Geom,
    len: usize,
}

/// One layer of the cache, read-only (what attention reads).
#[derive(Clone, Copy)]
pub(crate) struct KvLayer<'a, E> {
    pub k: &'a [E],
    pub v: &'a [E],
    /// A scaled type's K and V scales (empty otherwise).
    pub ks: &'a [f16],
    pub vs: &'a [f16],
    /// K tiles per KV head.
    pub tiles: usize,
    /// V rows per KV head.
    pub capacity: usize,
}

/// A layer of any element type.
#[derive(Clone, Copy)]
pub(crate) enum KvLayerRef<'a> {
    F32(KvLayer<'a, f32>),
    F16(KvLayer<'a, f16>),
    Q8(KvLayer<'a, Q8>),
}

/// Geometry shared by the typed helpers.
#[derive(Clone, Copy)]
struct Geom {
    n_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
}

/// One layer's buffers, writable.
struct LayerMut<'a, E> {
    k: &'a mut [E],
    v: &'a mut [E],
    ks: &'a mut [f16],
    vs: &'a mut [f16],
}

impl<E: KvElem> Bufs<E> {
    fn new(layers: usize, g: Geom) -> Self {
        let nb = E::blocks(g.head_dim);
        let bufs = |n: usize| (0..layers).map(|_| vec![E::default(); n]).collect();
        let scales = |n: usize| (0..layers).map(|_| vec![f16::ZERO; n]).collect();
        let (kn, vn) = (g.k_len(), g.n_kv_heads * g.capacity * g.head_dim);
        let (ksn, vsn) = (kn / g.head_dim * nb, vn / g.head_dim * nb);
        Bufs {
            k: bufs(kn),
            v: bufs(vn),
            ks: if nb > 0 { scales(ksn) } else { vec![] },
            vs: if nb > 0 { scales(vsn) } else { vec![] },
        }
    }

    fn layer_mut(&mut self, li: usize) -> LayerMut<'_, E> {
        LayerMut {
            k: &mut self.k[li],
            v: &mut self.v[li],
            ks: self.ks.get_mut(li).map_or(&mut [], |s| s.as_mut_slice()),
            vs: self.vs.get_mut(li).map_or(&mut [], |s| s.as_mut_slice()),
        }
    }

    fn layer(&self, li: usize, g: Geom) -> KvLayer<'_, E> {
        KvLayer {
            k: &self.k[li],
            v: &self.v[li],
            ks: self.ks.get(li).map_or(&[], |s| s.as_slice()),
            vs: self.vs.get(li).map_or(&[], |s| s.as_slice()),
            tiles: g.tiles(),
            capacity: g.capacity,
        }
    }
}

impl Geom {
    fn tiles(self) -> usize {
        self.capacity.div_ceil(KV_TILE)
    }

    /// K values per layer.
    fn k_len(self) -> usize {
        self.n_kv_heads * self.tiles() * KV_TILE * self.head_dim
    }

    #[inline]
    fn k_at(self, g: usize, slot: usize) -> usize {
        (g * self.tiles() + slot / KV_TILE) * self.head_dim * KV_TILE + slot % KV_TILE
    }

    /// The first K scale (block 0) of slot `slot` of KV head `g`; block `b`'s is `16 · b` on.
    #[inline]
    fn ks_at(self, nb: usize, g: usize, slot: usize) -> usize {
        (g * self.tiles() + slot / KV_TILE) * nb * KV_TILE + slot % KV_TILE
    }

    fn write<E: KvElem>(self, l: LayerMut<E>, slot0: usize, k: &[f32], v: &[f32]) {
        let (hd, row) = (self.head_dim, self.n_kv_heads * self.head_dim);
        let nb = E::blocks(hd);
        // One head's K row converted at a time, on the stack (no allocation per step).
        let mut kc = [E::default(); MAX_HEAD_DIM];
        let mut sc = [f16::ZERO; MAX_HEAD_DIM / QK];
        for t in 0..k.len() / row {
            let slot = slot0 + t;
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

    /// Copies slot `src` of `from` (of geometry `fg`) to slot `dst` of `to` (of this geometry);
    /// `from` None: within `to`.
    fn copy_slot<E: KvElem>(
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

impl KvCache {
    /// An f32 cache (the reference type).
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize, capacity: usize) -> Self {
        Self::with_dtype(n_layers, n_kv_heads, head_dim, capacity, KvDtype::F32)
    }

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
            store,
            geom,
            len: 0,
        }
    }

    /// `(layers, KV heads, head dim)`.
    pub fn geometry(&self) -> (usize, usize, usize) {
        let g = self.geom;
        (self.n_layers(), g.n_kv_heads, g.head_dim)
    }

    fn n_layers(&self) -> usize {
        each!(&self.store, b => b.k.len())
    }

    /// Bytes of K and V per slot ([`bytes_per_slot`] of this cache's geometry).
    pub fn bytes_per_slot(&self) -> usize {
        let (layers, heads, hd) = self.geometry();
        bytes_per_slot(layers, heads, hd, self.dtype())
    }

    pub fn dtype(&self) -> KvDtype {
        match self.store {
            Store::F32(..) => KvDtype::F32,
            Store::F16(..) => KvDtype::F16,
            Store::Q8(..) => KvDtype::Q8_0,
        }
    }

    /// Writes the K/V rows (`[n, n_kv_heads, head_dim]` each) of slots `slot0..slot0 + n`
    /// of layer `li`.
    pub(crate) fn write(&mut self, li: usize, slot0: usize, k: &[f32], v: &[f32]) {
        let g = self.geom;
        debug_assert!(v.len() == k.len());
        debug_assert!(slot0 + k.len() / (g.n_kv_heads * g.head_dim) <= g.capacity);
        each!(&mut self.store, b => g.write(b.layer_mut(li), slot0, k, v))
    }

    /// Layer `li`, for attention.
    pub(crate) fn layer(&self, li: usize) -> KvLayerRef<'_> {
        let g = self.geom;
        match &self.store {
            Store::F32(b) => KvLayerRef::F32(b.layer(li, g)),
            Store::F16(b) => KvLayerRef::F16(b.layer(li, g)),
            Store::Q8(b) => KvLayerRef::Q8(b.layer(li, g)),
        }
    }

    /// Moves slot `src` to slot `dst` in every layer.
    fn move_slot(&mut self, src: usize, dst: usize) {
        let g = self.geom;
        each!(&mut self.store, b => {
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
        self.geom.capacity
    }

    /// Reserves `n` slots after the current ones and returns the first; errors when full.
    pub(crate) fn reserve(&mut self, n: usize) -> Result<usize> {
        let start = self.len;
        if start + n > self.geom.capacity {
            return Err(Error::ContextOverflow {
                needed: start + n,
                capacity: self.geom.capacity,
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

    /// A cache of `n` slots holding this one's first `n` (a prompt's K/V, kept for reuse).
    pub fn prefix(&self, n: usize) -> Result<KvCache> {
        let n = n.min(self.len);
        let (layers, g) = (self.geometry().0, self.geom);
        let mut out = KvCache::with_dtype(layers, g.n_kv_heads, g.head_dim, n.max(1), self.dtype());
        out.copy_from(self, n)?;
        Ok(out)
    }

    /// Replaces this cache's contents by the first `n` slots of `src` (same layers, heads,
    /// head size and element type; any capacities holding `n`).
    pub fn copy_from(&mut self, src: &KvCache, n: usize) -> Result<()> {
        let (a, b) = (self.geom, src.geom);
        if self.geometry() != src.geometry() || self.dtype() != src.dtype() {
            return Err(Error::BadRequest(
                "copying K/V between caches of different shapes or types".into(),
            ));
        }
        if n > src.len || n > a.capacity {
            return Err(Error::ContextOverflow {
                needed: n,
                capacity: a.capacity.min(src.len),
            });
        }
        fn copy<E: KvElem>(a: Geom, b: Geom, to: &mut Bufs<E>, from: &Bufs<E>, n: usize) {
            for li in 0..to.k.len() {
                let mut l = to.layer_mut(li);
                for s in 0..n {
                    a.copy_slot(&mut l, Some((b, from, li)), s, s);
                }
            }
        }
        match (&mut self.store, &src.store) {
            (Store::F32(to), Store::F32(from)) => copy(a, b, to, from, n),
            (Store::F16(to), Store::F16(from)) => copy(a, b, to, from, n),
            (Store::Q8(to), Store::Q8(from)) => copy(a, b, to, from, n),
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
        self.len = keep_prefix + slots.len();
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    use crate::runtime::quant::{dequantize, quantize_q8_0, GgmlType};

    #[test]
    fn bytes_per_slot_counts_k_and_v_of_every_layer() {
        // 2 · layers · KV heads · a row of 64: f16 128 bytes, f32 256, q8_0 two blocks of 34.
        for (dtype, row) in [
            (KvDtype::F16, 128),
            (KvDtype::F32, 256),
            (KvDtype::Q8_0, 68),
        ] {
            let kv = KvCache::with_dtype(3, 2, 64, 40, dtype);
            assert_eq!(kv.bytes_per_slot(), 2 * 3 * 2 * row);
            assert_eq!(kv.bytes_per_slot(), bytes_per_slot(3, 2, 64, dtype));
        }
        // A head size of 80 ends in a block of 16: 80 + 3 scales.
        assert_eq!(KvDtype::Q8_0.row_bytes(80), 86);
        assert_eq!("q8_0".parse::<KvDtype>(), Ok(KvDtype::Q8_0));
        assert!("q4_0".parse::<KvDtype>().unwrap_err().contains("q8_0"));
    }

    /// What the cache holds for KV head `g` of slot `slot` of layer `li`, as f32 values.
    pub(crate) fn read(kv: &KvCache, li: usize, g: usize, slot: usize) -> (Vec<f32>, Vec<f32>) {
        fn typed<E: KvElem>(
            l: KvLayer<E>,
            geom: Geom,
            g: usize,
            slot: usize,
        ) -> (Vec<f32>, Vec<f32>) {
            let (hd, nb) = (geom.head_dim, E::blocks(geom.head_dim));
            let (kb, sb) = (geom.k_at(g, slot), geom.ks_at(nb, g, slot));
            let (vb, vsb) = (
                (g * geom.capacity + slot) * hd,
                (g * geom.capacity + slot) * nb,
            );
            let scaled = |x: E, s: Option<&f16>| x.get() * s.map_or(1.0, |s| s.to_f32());
            let k = (0..hd)
                .map(|d| scaled(l.k[kb + d * KV_TILE], l.ks.get(sb + d / QK * KV_TILE)))
                .collect();
            let v = (0..hd)
                .map(|d| scaled(l.v[vb + d], l.vs.get(vsb + d / QK)))
                .collect();
            (k, v)
        }
        match kv.layer(li) {
            KvLayerRef::F32(l) => typed(l, kv.geom, g, slot),
            KvLayerRef::F16(l) => typed(l, kv.geom, g, slot),
            KvLayerRef::Q8(l) => typed(l, kv.geom, g, slot),
        }
    }

    /// A row through llama.cpp's reference Q8_0 quantiser and back (`quantize_q8_0`,
    /// `dequantize`), padded with zeros to whole blocks.
    pub(crate) fn q8_roundtrip(x: &[f32]) -> Vec<f32> {
        let mut padded = x.to_vec();
        padded.resize(x.len().div_ceil(QK) * QK, 0.0);
        let mut out = vec![0f32; padded.len()];
        dequantize(GgmlType::Q8_0, &quantize_q8_0(&padded), &mut out);
        out.truncate(x.len());
        out
    }

    /// A Q8_0 cache holds what llama.cpp's Q8_0 quantiser makes of each KV head's row (head
    /// sizes that are and are not multiples of 32); after a tree compaction and a copy into a
    /// cache of another capacity every slot still holds its row, scales included.
    #[test]
    fn q8_0_rows_are_ggml_blocks_and_survive_moves() {
        let mut seed = 5u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 6.0
        };
        for hd in [64, 80, 20, 8] {
            let (layers, heads, n) = (2, 3, 37);
            let k: Vec<f32> = (0..n * heads * hd).map(|_| next()).collect();
            let mut v: Vec<f32> = (0..n * heads * hd).map(|_| next()).collect();
            v[..hd].fill(0.0); // an all-zero block: scale 0, values 0
            let mut kv = KvCache::with_dtype(layers, heads, hd, 50, KvDtype::Q8_0);
            kv.reserve(n).unwrap();
            for li in 0..layers {
                kv.write(li, 0, &k, &v);
            }
            let row = |x: &[f32], s: usize, g: usize| x[(s * heads + g) * hd..][..hd].to_vec();
            for li in 0..layers {
                for s in 0..n {
                    for g in 0..heads {
                        let (gk, gv) = read(&kv, li, g, s);
                        assert_eq!(
                            gk,
                            q8_roundtrip(&row(&k, s, g)),
                            "hd {hd} K slot {s} head {g}"
                        );
                        assert_eq!(
                            gv,
                            q8_roundtrip(&row(&v, s, g)),
                            "hd {hd} V slot {s} head {g}"
                        );
                    }
                }
            }
            let kept: Vec<usize> = vec![3, 17, 18, 30, 36];
            let slots: Vec<SlotId> = kept.iter().map(|&s| SlotId(s as u32)).collect();
            kv.compact(2, &slots).unwrap();
            let mut copy = KvCache::with_dtype(layers, heads, hd, 9, KvDtype::Q8_0);
            copy.copy_from(&kv, 7).unwrap();
            for (dst, src) in [0, 1].into_iter().zip([0, 1]).chain((2..).zip(kept)) {
                for g in 0..heads {
                    let want = (
                        q8_roundtrip(&row(&k, src, g)),
                        q8_roundtrip(&row(&v, src, g)),
                    );
                    assert_eq!(read(&kv, 1, g, dst), want, "hd {hd} compacted slot {dst}");
                    assert_eq!(read(&copy, 1, g, dst), want, "hd {hd} copied slot {dst}");
                }
            }
        }
    }

    /// The SIMD f32 → f16 conversions give `f16::from_f32`'s bits: ties to even, subnormals,
    /// overflow to infinity, signed zeros, lengths that are not multiples of the vector.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_f16_conversion_matches_scalar() {
        let mut src: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.37).collect();
        src.extend([
            0.0,
            -0.0,
            1.0 + f32::EPSILON,
            1.000_488_3, // halfway between two f16 values
            1.001_464_8,
            6.0e-8,
            -3.0e-5,
            65_504.0,
            65_520.0, // rounds to infinity
            1.0e9,
            -1.0e9,
            f32::INFINITY,
        ]);
        let want: Vec<f16> = src.iter().map(|&x| f16::from_f32(x)).collect();
        type Convert = unsafe fn(&[f32], &mut [f16]);
        let simd: [(bool, Convert); 2] = [
            (is_x86_feature_detected!("avx512f"), f16_avx512),
            (is_x86_feature_detected!("avx2"), f16_avx2),
        ];
        for (_, f) in simd.into_iter().filter(|(ok, _)| *ok) {
            for len in [src.len(), 7, 13, 0] {
                let mut got = vec![f16::ZERO; len];
                // SAFETY: the CPU has the features checked above (F16C comes with both).
                unsafe { f(&src[..len], &mut got) };
                let bits = |v: &[f16]| v.iter().map(|h| h.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want[..len]));
            }
        }
    }
}
