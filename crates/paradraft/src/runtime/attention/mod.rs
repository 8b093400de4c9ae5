//! Attention of `n_new` queries over the KV cache, with a causal or tree mask among the new
//! tokens and GQA without copying K/V.
//!
//! Work units are (new token, KV head, range of [`SLOT_CHUNK`] visible slots). The query heads
//! sharing a KV head are done together, so each K/V row is read once per unit, and the slot
//! ranges (split-K) give every thread work even in decode. Each range yields an unnormalised
//! partial softmax, merged in slot order afterwards.
//!
//! Scores: K is stored transposed in tiles of 16 slots ([`crate::kv::KV_TILE`]), so one vector
//! FMA per head dimension scores 16 slots of one query head; a score is a dot product summed in
//! a fixed order (even and odd dimensions in two chains, then added) whatever the tile's other
//! slots are. Softmax and the V sum then run over the token's *visible* slots in slot order.
//! So a token's arithmetic never depends on the batch it came in: batched and tree forwards
//! reproduce token-by-token decoding bit for bit, which lets greedy speculative decoding be
//! exactly AR greedy.

use super::isa::{isa, Isa};
use super::ops::fast_exp;
use super::quant::{par_ranges, SendPtr};
use crate::kv::{KvElem, KvLayer, KvLayerRef, KV_TILE};
use half::f16;
use std::cell::RefCell;

/// Slots per split-K range of attention.
pub const SLOT_CHUNK: usize = 128;

/// Geometry of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Cache slots before the new tokens; always visible to every new token.
    pub prefix: usize,
    /// Number of new tokens (their K/V sit at slots `prefix..prefix + n_new`).
    pub n_new: usize,
}

/// Which new tokens a new token attends to.
#[derive(Clone, Copy)]
pub enum Visibility<'a> {
    /// Token i sees new tokens 0..=i.
    Causal,
    /// Row-major `n_new × n_new`: `bits[i * n_new + j]` says whether i sees j.
    Mask(&'a [bool]),
}

/// One sequence's attention in [`attention_many`]: `q` is `[n_new, n_heads, head_dim]`, `out`
/// the same shape, and the new tokens' K/V must already be in `kv` at slots
/// `prefix..prefix + n_new`.
pub(crate) struct AttnJob<'a> {
    pub q: &'a [f32],
    pub kv: KvLayerRef<'a>,
    pub s: &'a AttnShape,
    pub vis: Visibility<'a>,
    pub out: &'a mut [f32],
}

fn kernel_for(s: &AttnShape) -> Kernel {
    kernel_of(isa(), s.head_dim)
}

/// The fastest attention kernel of an instruction set for a head size.
fn kernel_of(isa: Isa, head_dim: usize) -> Kernel {
    if isa.has_x86(Isa::Avx512Vnni) && head_dim.is_multiple_of(16) {
        Kernel::Avx512
    } else if isa.has_x86(Isa::Avx2) && head_dim.is_multiple_of(8) {
        Kernel::Avx2
    } else {
        Kernel::Portable
    }
}

/// The attention of several sequences (each over its own cache) in one parallel region: their
/// work units are pooled, so a multi-sequence decode step costs one fork-join per layer, not
/// one per sequence. Each job's result is that of a call with it alone. The jobs come from one
/// model's layer (same heads and head size) and their caches share an element type
/// (`Model::forward_multi` checks it).
pub(crate) fn attention_many(jobs: &mut [AttnJob]) {
    let Some(first) = jobs.first() else { return };
    let kern = kernel_for(first.s);
    let wrong = "the caches of one multi-sequence forward share an element type";
    if matches!(first.kv, KvLayerRef::F32(_)) {
        let typed = jobs
            .iter_mut()
            .map(|j| match j.kv {
                KvLayerRef::F32(l) => (j.q, l, j.s, j.vis, &mut *j.out),
                KvLayerRef::F16(_) => panic!("{wrong}"),
            })
            .collect();
        attention_with(kern, typed)
    } else {
        let typed = jobs
            .iter_mut()
            .map(|j| match j.kv {
                KvLayerRef::F16(l) => (j.q, l, j.s, j.vis, &mut *j.out),
                KvLayerRef::F32(_) => panic!("{wrong}"),
            })
            .collect();
        attention_with(kern, typed)
    }
}

/// One job's attention with a chosen kernel.
#[cfg(test)]
pub(crate) fn attention_kern(
    kern: Kernel,
    q: &[f32],
    kv: KvLayerRef,
    s: &AttnShape,
    vis: Visibility,
    out: &mut [f32],
) {
    match kv {
        KvLayerRef::F32(l) => attention_with(kern, vec![(q, l, s, vis, out)]),
        KvLayerRef::F16(l) => attention_with(kern, vec![(q, l, s, vis, out)]),
    }
}

/// An element type attention reads from the cache.
pub(crate) trait AttnElem: KvElem {
    /// 16 consecutive values widened to f32.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
    /// 8 consecutive values widened to f32 (AVX2 + F16C).
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl AttnElem for f32 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_loadu_ps(p)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
}

impl AttnElem for f16 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
}

/// Which implementation of the two inner loops (scores of a K tile, the V sum) to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    Portable,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512,
}

type TypedJob<'a, E> = (
    &'a [f32],
    KvLayer<'a, E>,
    &'a AttnShape,
    Visibility<'a>,
    &'a mut [f32],
);

fn attention_with<E: AttnElem>(kern: Kernel, jobs: Vec<TypedJob<E>>) {
    thread_local! {
        static PARTIAL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    }
    let hd = jobs[0].2.head_dim;
    let group = jobs[0].2.n_heads / jobs[0].2.n_kv_heads;
    let pw = hd + 2;
    // Per job: its first unit (and so its first partial record); its slot ranges.
    let chunks = |s: &AttnShape| (s.prefix + s.n_new).div_ceil(SLOT_CHUNK);
    let mut first_unit = Vec::with_capacity(jobs.len() + 1);
    let mut units = 0;
    for (q, kv, s, _, out) in &jobs {
        assert!(
            s.prefix + s.n_new <= kv.capacity,
            "attention past the cache"
        );
        assert_eq!(out.len(), s.n_new * s.n_heads * hd);
        assert_eq!(q.len(), out.len());
        first_unit.push(units);
        units += s.n_new * s.n_kv_heads * chunks(s);
    }
    first_unit.push(units);
    PARTIAL.with_borrow_mut(|partial| {
        partial.resize(units * group * pw, 0.0);
        let base = partial.as_mut_ptr();
        let args: Vec<Args<E>> = jobs
            .iter()
            .enumerate()
            .map(|(i, (q, kv, s, vis, _))| Args {
                q,
                kv: *kv,
                s,
                vis: *vis,
                chunks: chunks(s),
                kern,
                // SAFETY: job i's records start after those of the jobs before it.
                out: SendPtr(unsafe { base.add(first_unit[i] * group * pw) }),
            })
            .collect();
        let (args, first_unit) = (&args, &first_unit);
        par_ranges(units, |u0, u1| {
            UNIT.with_borrow_mut(|scratch| {
                let mut j = first_unit.partition_point(|&f| f <= u0) - 1;
                for unit in u0..u1 {
                    while unit >= first_unit[j + 1] {
                        j += 1;
                    }
                    // SAFETY: each unit writes only its own partial records.
                    unsafe { dispatch(&args[j], unit - first_unit[j], scratch) };
                }
            })
        });
        for (i, (.., out)) in jobs.into_iter().enumerate() {
            let recs = &partial[first_unit[i] * group * pw..first_unit[i + 1] * group * pw];
            merge(recs, args[i].chunks, group, hd, out);
        }
    });
}

/// Merges the partial softmaxes of each (token, head) in slot-range order.
fn merge(partial: &[f32], chunks: usize, group: usize, hd: usize, out: &mut [f32]) {
    let pw = hd + 2;
    for (bu, o) in out.chunks_exact_mut(group * hd).enumerate() {
        for (j, oh) in o.chunks_exact_mut(hd).enumerate() {
            let rec = |c: usize| &partial[((bu * chunks + c) * group + j) * pw..][..pw];
            let m = (0..chunks)
                .map(|c| rec(c)[0])
                .fold(f32::NEG_INFINITY, f32::max);
            oh.fill(0.0);
            let mut l = 0.0;
            for c in 0..chunks {
                let r = rec(c);
                if r[1] == 0.0 {
                    continue; // no visible slot in this range
                }
                let w = fast_exp(r[0] - m);
                l += w * r[1];
                for (a, &b) in oh.iter_mut().zip(&r[2..]) {
                    *a += w * b;
                }
            }
            let inv = 1.0 / l;
            oh.iter_mut().for_each(|a| *a *= inv);
        }
    }
}

struct Args<'a, E> {
    q: &'a [f32],
    kv: KvLayer<'a, E>,
    s: &'a AttnShape,
    vis: Visibility<'a>,
    /// Slot ranges per (token, KV head).
    chunks: usize,
    kern: Kernel,
    /// Partial records: per (unit, head) running max, sum of exponentials, unnormalised output.
    out: SendPtr,
}

/// Per-thread buffers of a unit.
#[derive(Default)]
struct UnitScratch {
    slots: Vec<u32>,
    /// `group × len` scores, then probabilities.
    scores: Vec<f32>,
    /// `group × 16` scores of one K tile.
    tile: Vec<f32>,
}

thread_local! {
    static UNIT: RefCell<UnitScratch> = RefCell::new(UnitScratch::default());
}

unsafe fn dispatch<E: AttnElem>(a: &Args<E>, unit: usize, us: &mut UnitScratch) {
    match a.kern {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => unit_avx512(a, unit, us),
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unit_avx2(a, unit, us),
        _ => unit_portable(a, unit, us),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unit_avx2<E: AttnElem>(a: &Args<E>, unit: usize, us: &mut UnitScratch) {
    attend::<avx2::K, E>(a, unit, us)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn unit_avx512<E: AttnElem>(a: &Args<E>, unit: usize, us: &mut UnitScratch) {
    attend::<avx512::K, E>(a, unit, us)
}

unsafe fn unit_portable<E: AttnElem>(a: &Args<E>, unit: usize, us: &mut UnitScratch) {
    attend::<Portable, E>(a, unit, us)
}

/// Where a unit's partial records go: per head `j`, `pw` floats from `out + j·pw` (max, sum,
/// then the unnormalised output).
#[derive(Clone, Copy)]
struct Records {
    out: *mut f32,
    pw: usize,
}

/// The two inner loops, per instruction set.
trait Inner {
    /// `out[j·16 + l] = Σ_d q[j·hd + d] · kt[d·16 + l]` for the `group` heads of `q`, summed as
    /// even dimensions plus odd dimensions, each in dimension order.
    unsafe fn tile_scores<E: AttnElem>(kt: &[E], q: &[f32], hd: usize, out: &mut [f32]);
    /// Head `j`'s output `Σ_i p[j·len + i] · v[slots[i]·hd + d]`, summed in slot order, into
    /// its record, for each of the `p.len() / slots.len()` heads.
    unsafe fn weighted_v<E: AttnElem>(p: &[f32], slots: &[u32], v: &[E], hd: usize, r: Records);
}

struct Portable;
impl Inner for Portable {
    #[inline(always)]
    unsafe fn tile_scores<E: AttnElem>(kt: &[E], q: &[f32], hd: usize, out: &mut [f32]) {
        for (qh, o) in q.chunks_exact(hd).zip(out.chunks_exact_mut(KV_TILE)) {
            let mut even = [0f32; KV_TILE];
            let mut odd = [0f32; KV_TILE];
            for d in (0..hd).step_by(2) {
                for l in 0..KV_TILE {
                    even[l] += qh[d] * kt[d * KV_TILE + l].get();
                }
                if d + 1 < hd {
                    for l in 0..KV_TILE {
                        odd[l] += qh[d + 1] * kt[(d + 1) * KV_TILE + l].get();
                    }
                }
            }
            for l in 0..KV_TILE {
                o[l] = even[l] + odd[l];
            }
        }
    }

    #[inline(always)]
    unsafe fn weighted_v<E: AttnElem>(p: &[f32], slots: &[u32], v: &[E], hd: usize, r: Records) {
        let len = slots.len();
        for j in 0..p.len() / len.max(1) {
            let o = std::slice::from_raw_parts_mut(r.out.add(j * r.pw + 2), hd);
            o.fill(0.0);
            for (i, &slot) in slots.iter().enumerate() {
                let w = p[j * len + i];
                let vr = &v[slot as usize * hd..][..hd];
                for (a, &b) in o.iter_mut().zip(vr) {
                    *a += w * b.get();
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(target_arch = "x86_64")]
mod avx2;

/// One unit: token `t`'s query heads of KV head `g` over the `c`-th range of its visible slots.
#[inline(always)]
unsafe fn attend<I: Inner, E: AttnElem>(a: &Args<E>, unit: usize, us: &mut UnitScratch) {
    let Args {
        q,
        kv,
        s,
        vis,
        chunks,
        ..
    } = *a;
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let (t, g, c) = (
        unit / (s.n_kv_heads * chunks),
        unit / chunks % s.n_kv_heads,
        unit % chunks,
    );
    // The c-th run of SLOT_CHUNK slots among those this token sees, in slot order: the cached
    // prefix, then its visible new tokens (for a tree: its ancestors, by depth). A token sees
    // the same sequence of K/V rows whether it runs alone, in a chain or in a tree.
    let (lo, hi) = (c * SLOT_CHUNK, (c + 1) * SLOT_CHUNK);
    let slots = &mut us.slots;
    slots.clear();
    if lo < s.prefix {
        slots.extend(lo as u32..hi.min(s.prefix) as u32);
    }
    if hi > s.prefix {
        match vis {
            // New tokens 0..=t: one contiguous run of slots.
            Visibility::Causal => {
                let end = hi.min(s.prefix + t + 1);
                slots.extend(lo.max(s.prefix) as u32..end.max(lo.max(s.prefix)) as u32);
            }
            Visibility::Mask(bits) => slots.extend(
                (0..s.n_new)
                    .filter(|&j| bits[t * s.n_new + j])
                    .skip(lo.saturating_sub(s.prefix))
                    .take(hi - lo.max(s.prefix))
                    .map(|j| (s.prefix + j) as u32),
            ),
        }
    }
    let len = slots.len();
    let scores = &mut us.scores;
    scores.clear();
    scores.resize(group * len, f32::NEG_INFINITY);
    us.tile.resize(group * KV_TILE, 0.0);
    let qs = &q[(t * s.n_heads + g * group) * hd..][..group * hd];
    let kh = &kv.k[g * kv.tiles * hd * KV_TILE..][..kv.tiles * hd * KV_TILE];
    let mut i = 0;
    while i < len {
        let tile = slots[i] as usize / KV_TILE;
        I::tile_scores(
            &kh[tile * hd * KV_TILE..][..hd * KV_TILE],
            qs,
            hd,
            &mut us.tile,
        );
        // A whole tile of consecutive slots (most of the cached prefix): its scores in one
        // vector pass per head; the same products as the slot-by-slot loop below.
        let t0 = tile * KV_TILE;
        if i + KV_TILE <= len && slots[i + KV_TILE - 1] as usize == t0 + KV_TILE - 1 {
            // Slots rise strictly, so slots[i..i + 16] are t0..t0 + 16.
            for j in 0..group {
                let src = &us.tile[j * KV_TILE..][..KV_TILE];
                let dst = &mut scores[j * len + i..][..KV_TILE];
                for (d, &v) in dst.iter_mut().zip(src) {
                    *d = v * scale;
                }
            }
            i += KV_TILE;
            continue;
        }
        while i < len && slots[i] as usize / KV_TILE == tile {
            let l = slots[i] as usize % KV_TILE;
            for j in 0..group {
                *scores.get_unchecked_mut(j * len + i) = us.tile[j * KV_TILE + l] * scale;
            }
            i += 1;
        }
    }
    // This unit's partial records: m, l, then the unnormalised output.
    let (base, pw) = (a.out.0.add(unit * group * (hd + 2)), hd + 2);
    for j in 0..group {
        let sc = &mut scores[j * len..(j + 1) * len];
        let max = lane_max(sc);
        let mut sum = 0.0;
        if max > f32::NEG_INFINITY {
            for x in sc.iter_mut() {
                *x = fast_exp(*x - max);
            }
            sum = lane_sum(sc);
        }
        *base.add(j * pw) = max;
        *base.add(j * pw + 1) = sum;
    }
    let vh = &kv.v[g * kv.capacity * hd..][..kv.capacity * hd];
    I::weighted_v(scores, slots, vh, hd, Records { out: base, pw });
}

/// The largest of `x` (NaNs ignored, −∞ when empty) in 16 lanes, so that it vectorises
/// (`f32::max`'s NaN rule keeps a plain fold scalar). The maximum does not depend on the order.
#[inline(always)]
fn lane_max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let mut ch = x.chunks_exact(16);
    for c in &mut ch {
        for l in 0..16 {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    for (l, &v) in ch.remainder().iter().enumerate() {
        acc[l] = if v > acc[l] { v } else { acc[l] };
    }
    acc.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// Σ x in a fixed order: 16 lane sums (element i into lane i mod 16), then the lanes in order.
#[inline(always)]
fn lane_sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let mut ch = x.chunks_exact(16);
    for c in &mut ch {
        for l in 0..16 {
            acc[l] += c[l];
        }
    }
    for (l, &v) in ch.remainder().iter().enumerate() {
        acc[l] += v;
    }
    acc.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{KvCache, KvDtype};

    use crate::runtime::qmatmul::tests::{runnable, Lcg};

    /// The vectorised maximum equals the scalar fold, NaNs and empty slices included.
    #[test]
    fn lane_max_is_the_fold() {
        let mut rng = Lcg(3);
        for n in [0, 1, 5, 16, 17, 40, 333] {
            let mut x: Vec<f32> = (0..n).map(|_| sym(&mut rng) * 50.0).collect();
            if n > 3 {
                x[2] = f32::NAN;
            }
            let want = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(lane_max(&x).to_bits(), want.to_bits(), "n = {n}");
        }
        assert_eq!(lane_max(&[f32::NEG_INFINITY; 20]), f32::NEG_INFINITY);
    }

    /// Uniform in [−1, 1).
    fn sym(rng: &mut Lcg) -> f32 {
        rng.unif() * 2.0 - 1.0
    }

    /// A random attention call: its shape (heads, KV heads, head size; `prefix` cached and
    /// `n_new` new tokens), then K and V for every slot and the new tokens' queries, K and Q
    /// uniform in ±`kq`, V in ±1.
    fn case(
        rng: &mut Lcg,
        (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
        prefix: usize,
        n_new: usize,
        kq: f32,
    ) -> (AttnShape, Vec<f32>, Vec<f32>, Vec<f32>) {
        let s = AttnShape {
            n_heads,
            n_kv_heads,
            head_dim,
            prefix,
            n_new,
        };
        let cache = (prefix + n_new) * n_kv_heads * head_dim;
        let k = (0..cache).map(|_| sym(rng) * kq).collect();
        let v = (0..cache).map(|_| sym(rng)).collect();
        let q = (0..n_new * n_heads * head_dim)
            .map(|_| sym(rng) * kq)
            .collect();
        (s, k, v, q)
    }

    /// f64 softmax attention, straight from the definition.
    fn reference(q: &[f32], k: &[f32], v: &[f32], s: &AttnShape, mask: &[bool]) -> Vec<f32> {
        let (hd, group) = (s.head_dim, s.n_heads / s.n_kv_heads);
        let row = s.n_kv_heads * hd;
        let mut out = vec![0f32; q.len()];
        for t in 0..s.n_new {
            let seen: Vec<usize> = (0..s.prefix)
                .chain(
                    (0..s.n_new)
                        .filter(|&j| mask[t * s.n_new + j])
                        .map(|j| s.prefix + j),
                )
                .collect();
            for h in 0..s.n_heads {
                let g = h / group;
                let qh = &q[(t * s.n_heads + h) * hd..][..hd];
                let sc: Vec<f64> = seen
                    .iter()
                    .map(|&sl| {
                        let kr = &k[sl * row + g * hd..][..hd];
                        qh.iter()
                            .zip(kr)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    let o: f64 = seen
                        .iter()
                        .zip(&e)
                        .map(|(&sl, &w)| w * v[sl * row + g * hd + d] as f64)
                        .sum();
                    out[(t * s.n_heads + h) * hd + d] = (o / z) as f32;
                }
            }
        }
        out
    }

    /// Every kernel against the f64 reference (max abs error 2e-5 on unit-scale values), on
    /// prefixes that are and are not multiples of the tile and the slot range, causal and tree
    /// masks, GQA groups of 1, 3 and 4, head sizes 16, 64, 80 (AVX-512: multiples of 16 only;
    /// AVX2 also 8; portable also 20).
    #[test]
    fn kernels_match_reference() {
        crate::runtime::init_threads(2);
        let mut rng = Lcg(7);
        for &(n_heads, n_kv, hd) in &[(4, 4, 16), (9, 3, 64), (8, 2, 80), (4, 1, 8), (6, 2, 20)] {
            for &(prefix, n_new) in &[(0, 1), (5, 3), (37, 16), (130, 9), (255, 2), (300, 1)] {
                for tree in [false, true] {
                    let (s, k, v, q) = case(&mut rng, (n_heads, n_kv, hd), prefix, n_new, 2.0);
                    let total = prefix + n_new;
                    // A tree: node i's parent is (i − 1) / 2.
                    let mut mask = vec![false; n_new * n_new];
                    for i in 0..n_new {
                        let mut j = Some(i);
                        while let Some(x) = j {
                            mask[i * n_new + x] = true;
                            j = if !tree {
                                x.checked_sub(1)
                            } else if x == 0 {
                                None
                            } else {
                                Some((x - 1) / 2)
                            };
                        }
                    }
                    let vis = Visibility::Mask(&mask);
                    // Every kernel this CPU runs for this head size.
                    let mut kerns: Vec<Kernel> =
                        runnable().into_iter().map(|i| kernel_of(i, hd)).collect();
                    kerns.dedup();
                    for (kern, dtype) in kerns
                        .into_iter()
                        .flat_map(|k| [(k, KvDtype::F32), (k, KvDtype::F16)])
                    {
                        let mut kv = KvCache::with_dtype(1, n_kv, hd, total + 3, dtype);
                        kv.write(0, 0, &k, &v);
                        // The reference sees what the cache holds (f16-rounded K/V for f16).
                        let round = |x: &Vec<f32>| -> Vec<f32> {
                            match dtype {
                                KvDtype::F32 => x.clone(),
                                KvDtype::F16 => {
                                    x.iter().map(|&y| f16::from_f32(y).to_f32()).collect()
                                }
                            }
                        };
                        let want = reference(&q, &round(&k), &round(&v), &s, &mask);
                        let mut out = vec![0f32; q.len()];
                        attention_kern(kern, &q, kv.layer(0), &s, vis, &mut out);
                        let err = out
                            .iter()
                            .zip(&want)
                            .map(|(a, b)| (a - b).abs())
                            .fold(0f32, f32::max);
                        assert!(err < 2e-5, "{kern:?} {dtype:?} heads {n_heads}/{n_kv} hd {hd} prefix {prefix} new {n_new} tree {tree}: {err}");
                        if !tree {
                            let mut causal = vec![0f32; q.len()];
                            attention_kern(
                                kern,
                                &q,
                                kv.layer(0),
                                &s,
                                Visibility::Causal,
                                &mut causal,
                            );
                            assert_eq!(causal, out, "Causal and its explicit mask differ");
                        }
                    }
                }
            }
        }
    }

    /// Time of attention over 30 layers' caches in SmolLM2-135M's geometry (9 heads, 3 KV
    /// heads, head size 64, f16 cache) for cached prefixes and new-token counts, and the K/V
    /// bytes it reads per second (run with `--ignored --nocapture`; 2 threads).
    #[test]
    #[ignore]
    fn attention_timing() {
        crate::runtime::init_threads(2);
        let mut rng = Lcg(9);
        let (n_heads, n_kv, hd) = (9, 3, 64);
        for prefix in [64, 320, 640] {
            for n_new in [1, 4, 16] {
                let (s, k, v, q) = case(&mut rng, (n_heads, n_kv, hd), prefix, n_new, 1.0);
                let total = prefix + n_new;
                // 30 layers' caches, as a forward reads them one after the other.
                let mut kv = KvCache::with_dtype(30, n_kv, hd, total, KvDtype::F16);
                for l in 0..30 {
                    kv.write(l, 0, &k, &v);
                }
                let mut out = vec![0f32; q.len()];
                let reps = 20;
                let dt = (0..5)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        for _ in 0..reps {
                            for l in 0..30 {
                                let job = AttnJob {
                                    q: &q,
                                    kv: kv.layer(l),
                                    s: &s,
                                    vis: Visibility::Causal,
                                    out: &mut out,
                                };
                                attention_many(&mut [job]);
                            }
                        }
                        t.elapsed().as_secs_f64() / reps as f64
                    })
                    .fold(f64::INFINITY, f64::min);
                let bytes = 30.0 * (n_new * (prefix + n_new) * 2 * n_kv * hd * 2) as f64;
                eprintln!(
                    "prefix {prefix} new {n_new}: {:.3} ms for 30 layers, {:.1} GB/s of K/V per row",
                    dt * 1e3,
                    bytes / dt / 1e9
                );
            }
        }
    }
}
