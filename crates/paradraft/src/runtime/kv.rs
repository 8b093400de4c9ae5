//! The target's KV cache: preallocated per layer, append-only during a forward, truncated
//! (chain verification) or gather-compacted (tree verification) afterwards.

use crate::error::{Error, Result};
use crate::types::SlotId;
use half::f16;

/// Slots per K tile: K is stored transposed in tiles of this many slots, so attention
/// scores 16 slots with one vector FMA per head dimension.
pub const KV_TILE: usize = 16;

/// Largest head size the cache takes (checked when a model's config is validated).
pub const MAX_HEAD_DIM: usize = 512;

/// Element type of the cache. f16 halves the bytes attention reads (llama.cpp's default);
/// f32 is the reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvDtype {
    #[default]
    F16,
    F32,
}

impl std::str::FromStr for KvDtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f16" => Ok(KvDtype::F16),
            "f32" => Ok(KvDtype::F32),
            _ => Err(format!("KV cache type `{s}`: expected f16 or f32")),
        }
    }
}

impl KvDtype {
    /// Bytes per stored value.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
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
    2 * n_layers * n_kv_heads * head_dim * dtype.bytes()
}

/// A value the cache can store.
pub(crate) trait KvElem: Copy + Default + Send + Sync + 'static {
    fn of(x: f32) -> Self;
    fn get(self) -> f32;
    /// `dst[i] = of(src[i])`, vectorised where the type allows.
    fn convert(src: &[f32], dst: &mut [Self]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = Self::of(x);
        }
    }
}
impl KvElem for f32 {
    #[inline(always)]
    fn of(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn get(self) -> f32 {
        self
    }
}
impl KvElem for f16 {
    #[inline(always)]
    fn of(x: f32) -> Self {
        f16::from_f32(x)
    }
    #[inline(always)]
    fn get(self) -> f32 {
        self.to_f32()
    }
    fn convert(src: &[f32], dst: &mut [f16]) {
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
/// `[n_kv_heads, capacity, head_dim]`.
#[derive(Clone)]
enum Store {
    F32(Vec<Vec<f32>>, Vec<Vec<f32>>),
    F16(Vec<Vec<f16>>, Vec<Vec<f16>>),
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
    /// K tiles per KV head.
    pub tiles: usize,
    /// V rows per KV head.
    pub capacity: usize,
}

/// A layer of either element type.
#[derive(Clone, Copy)]
pub(crate) enum KvLayerRef<'a> {
    F32(KvLayer<'a, f32>),
    F16(KvLayer<'a, f16>),
}

/// Geometry shared by the typed helpers.
#[derive(Clone, Copy)]
struct Geom {
    n_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
}

impl Geom {
    fn tiles(self) -> usize {
        self.capacity.div_ceil(KV_TILE)
    }

    #[inline]
    fn k_at(self, g: usize, slot: usize) -> usize {
        (g * self.tiles() + slot / KV_TILE) * self.head_dim * KV_TILE + slot % KV_TILE
    }

    fn write<E: KvElem>(self, kl: &mut [E], vl: &mut [E], slot0: usize, k: &[f32], v: &[f32]) {
        let (hd, row) = (self.head_dim, self.n_kv_heads * self.head_dim);
        // One head's K row converted at a time, on the stack (no allocation per step).
        let mut kc = [E::default(); MAX_HEAD_DIM];
        for t in 0..k.len() / row {
            let slot = slot0 + t;
            for g in 0..self.n_kv_heads {
                E::convert(&k[t * row + g * hd..][..hd], &mut kc[..hd]);
                let base = self.k_at(g, slot);
                for (d, &x) in kc[..hd].iter().enumerate() {
                    kl[base + d * KV_TILE] = x;
                }
                let vo = (g * self.capacity + slot) * hd;
                E::convert(&v[t * row + g * hd..][..hd], &mut vl[vo..vo + hd]);
            }
        }
    }

    fn move_slot<E: KvElem>(self, kl: &mut [E], vl: &mut [E], src: usize, dst: usize) {
        let hd = self.head_dim;
        for g in 0..self.n_kv_heads {
            let (a, b) = (self.k_at(g, src), self.k_at(g, dst));
            for d in 0..hd {
                kl[b + d * KV_TILE] = kl[a + d * KV_TILE];
            }
            let (a, b) = (
                (g * self.capacity + src) * hd,
                (g * self.capacity + dst) * hd,
            );
            vl.copy_within(a..a + hd, b);
        }
    }

    fn layer<'a, E>(self, k: &'a [E], v: &'a [E]) -> KvLayer<'a, E> {
        KvLayer {
            k,
            v,
            tiles: self.tiles(),
            capacity: self.capacity,
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
        let kn = n_kv_heads * capacity.div_ceil(KV_TILE) * KV_TILE * head_dim;
        let vn = n_kv_heads * capacity * head_dim;
        fn bufs<E: KvElem>(layers: usize, n: usize) -> Vec<Vec<E>> {
            (0..layers).map(|_| vec![E::default(); n]).collect()
        }
        let store = match dtype {
            KvDtype::F32 => Store::F32(bufs(n_layers, kn), bufs(n_layers, vn)),
            KvDtype::F16 => Store::F16(bufs(n_layers, kn), bufs(n_layers, vn)),
        };
        KvCache {
            store,
            geom: Geom {
                n_kv_heads,
                head_dim,
                capacity,
            },
            len: 0,
        }
    }

    /// `(layers, KV heads, head dim)`.
    pub fn geometry(&self) -> (usize, usize, usize) {
        let g = self.geom;
        (self.n_layers(), g.n_kv_heads, g.head_dim)
    }

    fn n_layers(&self) -> usize {
        match &self.store {
            Store::F32(k, _) => k.len(),
            Store::F16(k, _) => k.len(),
        }
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
        }
    }

    /// Writes the K/V rows (`[n, n_kv_heads, head_dim]` each) of slots `slot0..slot0 + n`
    /// of layer `li`.
    pub(crate) fn write(&mut self, li: usize, slot0: usize, k: &[f32], v: &[f32]) {
        let g = self.geom;
        debug_assert!(v.len() == k.len());
        debug_assert!(slot0 + k.len() / (g.n_kv_heads * g.head_dim) <= g.capacity);
        match &mut self.store {
            Store::F32(kb, vb) => g.write(&mut kb[li], &mut vb[li], slot0, k, v),
            Store::F16(kb, vb) => g.write(&mut kb[li], &mut vb[li], slot0, k, v),
        }
    }

    /// Layer `li`, for attention.
    pub(crate) fn layer(&self, li: usize) -> KvLayerRef<'_> {
        let g = self.geom;
        match &self.store {
            Store::F32(kb, vb) => KvLayerRef::F32(g.layer(&kb[li], &vb[li])),
            Store::F16(kb, vb) => KvLayerRef::F16(g.layer(&kb[li], &vb[li])),
        }
    }

    /// Moves slot `src` to slot `dst` in every layer.
    fn move_slot(&mut self, src: usize, dst: usize) {
        let g = self.geom;
        match &mut self.store {
            Store::F32(kb, vb) => kb
                .iter_mut()
                .zip(vb)
                .for_each(|(k, v)| g.move_slot(k, v, src, dst)),
            Store::F16(kb, vb) => kb
                .iter_mut()
                .zip(vb)
                .for_each(|(k, v)| g.move_slot(k, v, src, dst)),
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
        fn copy<E: Copy>(
            a: Geom,
            b: Geom,
            dk: &mut [E],
            dv: &mut [E],
            sk: &[E],
            sv: &[E],
            n: usize,
        ) {
            let hd = a.head_dim;
            for g in 0..a.n_kv_heads {
                for s in 0..n {
                    let (x, y) = (a.k_at(g, s), b.k_at(g, s));
                    for d in 0..hd {
                        dk[x + d * KV_TILE] = sk[y + d * KV_TILE];
                    }
                    let (x, y) = ((g * a.capacity + s) * hd, (g * b.capacity + s) * hd);
                    dv[x..x + hd].copy_from_slice(&sv[y..y + hd]);
                }
            }
        }
        match (&mut self.store, &src.store) {
            (Store::F32(dk, dv), Store::F32(sk, sv)) => {
                for l in 0..dk.len() {
                    copy(a, b, &mut dk[l], &mut dv[l], &sk[l], &sv[l], n);
                }
            }
            (Store::F16(dk, dv), Store::F16(sk, sv)) => {
                for l in 0..dk.len() {
                    copy(a, b, &mut dk[l], &mut dv[l], &sk[l], &sv[l], n);
                }
            }
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
mod tests {
    use super::*;

    #[test]
    fn bytes_per_slot_counts_k_and_v_of_every_layer() {
        for (dtype, elem) in [(KvDtype::F16, 2), (KvDtype::F32, 4)] {
            let kv = KvCache::with_dtype(3, 2, 8, 40, dtype);
            assert_eq!(kv.bytes_per_slot(), 2 * 3 * 2 * 8 * elem);
            assert_eq!(kv.bytes_per_slot(), bytes_per_slot(3, 2, 8, dtype));
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
