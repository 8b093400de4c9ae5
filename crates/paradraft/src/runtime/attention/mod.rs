//! Attention of `n_new` queries over the KV cache, with a causal or tree mask among the new
//! tokens and GQA without copying K/V.
//!
//! Work units are (block of up to [`TOKEN_BLOCK`] new tokens, KV head, range of [`SLOT_CHUNK`]
//! visible slots). The query heads sharing a KV head are done together, and so are the block's
//! tokens over the slots they all see in that range (the cached prefix, and in a tree or a
//! causal chunk their common ancestors): each K/V tile of those slots is read and widened once
//! for all of them, and each token then goes on alone over the slots only it sees. The slot
//! ranges (split-K) give every thread work even in decode. Each range yields an unnormalised
//! partial softmax, merged in slot order afterwards.
//!
//! Scores: K is stored transposed in tiles of 16 slots ([`crate::runtime::kv::KV_TILE`]), so one vector
//! FMA per head dimension scores 16 slots of one query head; a score is a dot product summed in
//! a fixed order (even and odd dimensions in two chains, then added) whatever the tile's other
//! slots are. Softmax and the V sum then run over the token's *visible* slots in slot order.
//! So a token's arithmetic never depends on the batch it came in: batched and tree forwards
//! reproduce token-by-token decoding bit for bit, which lets greedy speculative decoding be
//! exactly AR greedy.

use super::isa::{isa, Isa};
use super::ops::{fast_exp, softcap};
use super::quant::{par_ranges, SendPtr};
use crate::runtime::ggml::QK;
use crate::runtime::kv::{phys, KvElem, KvLayer, KvLayerRef, KV_TILE, Q8};
use crate::types::Pos;
use half::f16;
use std::cell::RefCell;

/// Slots per split-K range of attention.
pub const SLOT_CHUNK: usize = 128;

/// New tokens per work unit (SmolLM2's GQA group of 3: 12 query heads over each shared tile).
pub const TOKEN_BLOCK: usize = 4;

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
    pub rule: Rule<'a>,
    pub out: &'a mut [f32],
}

/// How scores are scaled, and which of the visible slots fall out of a sliding window.
#[derive(Clone, Copy, Debug)]
pub struct Rule<'a> {
    /// Scores are `q·k · scale` (usually 1/√head_dim).
    pub scale: f32,
    /// Scores (after scaling) become c·tanh(score / c) (Gemma 2).
    pub softcap: Option<f32>,
    pub window: Option<Window<'a>>,
}

impl Rule<'_> {
    /// 1/√head_dim, no window.
    pub fn plain(head_dim: usize) -> Rule<'static> {
        Rule {
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: None,
            window: None,
        }
    }
}

/// A sliding window: a token at position p sees only keys at positions above p − `size`. The
/// cached prefix's slot j holds position j; `positions` are the new tokens'.
#[derive(Clone, Copy, Debug)]
pub struct Window<'a> {
    pub size: usize,
    pub positions: &'a [Pos],
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
    let kind = std::mem::discriminant(&first.kv);
    assert!(
        jobs.iter().all(|j| std::mem::discriminant(&j.kv) == kind),
        "the caches of one multi-sequence forward share an element type"
    );
    macro_rules! typed {
        ($ty:ident) => {
            attention_with(
                kern,
                TOKEN_BLOCK,
                jobs.iter_mut()
                    .filter_map(|j| match j.kv {
                        KvLayerRef::$ty(l) => Some((j.q, l, j.s, j.vis, j.rule, &mut *j.out)),
                        _ => None,
                    })
                    .collect(),
            )
        };
    }
    match jobs[0].kv {
        KvLayerRef::F32(_) => typed!(F32),
        KvLayerRef::F16(_) => typed!(F16),
        KvLayerRef::Q8(_) => typed!(Q8),
    }
}

/// One job's attention with a chosen kernel and `tb` tokens per work unit.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_kern(
    kern: Kernel,
    tb: usize,
    q: &[f32],
    kv: KvLayerRef,
    s: &AttnShape,
    vis: Visibility,
    rule: Rule,
    out: &mut [f32],
) {
    match kv {
        KvLayerRef::F32(l) => attention_with(kern, tb, vec![(q, l, s, vis, rule, out)]),
        KvLayerRef::F16(l) => attention_with(kern, tb, vec![(q, l, s, vis, rule, out)]),
        KvLayerRef::Q8(l) => attention_with(kern, tb, vec![(q, l, s, vis, rule, out)]),
    }
}

/// An element type attention reads from the cache. A scaled type's values are widened here
/// and multiplied by their block's scale in the kernels (an int8 by an f16 scale: the product
/// is exact in f32, so a score or a V sum has the bits of an f32 cache holding the dequantized
/// values).
pub(crate) trait AttnElem: KvElem {
    /// 16 consecutive values widened to f32 (before any scale).
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

impl AttnElem for Q8 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Q8) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i)))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Q8) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)))
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
    Rule<'a>,
    &'a mut [f32],
);

fn attention_with<E: AttnElem>(kern: Kernel, tb: usize, jobs: Vec<TypedJob<E>>) {
    thread_local! {
        static PARTIAL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    }
    let hd = jobs[0].2.head_dim;
    // Partial records per unit: one per (token of its block, query head of its KV head).
    let per_unit = tb * (jobs[0].2.n_heads / jobs[0].2.n_kv_heads);
    let pw = hd + 2;
    // Per job: its first unit (and so its first partial record); its slot ranges.
    let chunks = |s: &AttnShape| (s.prefix + s.n_new).div_ceil(SLOT_CHUNK);
    let mut first_unit = Vec::with_capacity(jobs.len() + 1);
    let mut units = 0;
    for (q, kv, s, _, rule, out) in &jobs {
        if let Some(w) = rule.window {
            assert_eq!(w.positions.len(), s.n_new, "a position per new token");
        }
        assert!(s.prefix + s.n_new <= kv.slots, "attention past the cache");
        assert_eq!(out.len(), s.n_new * s.n_heads * hd);
        assert_eq!(q.len(), out.len());
        first_unit.push(units);
        units += s.n_new.div_ceil(tb) * s.n_kv_heads * chunks(s);
    }
    first_unit.push(units);
    PARTIAL.with_borrow_mut(|partial| {
        partial.resize(units * per_unit * pw, 0.0);
        let base = partial.as_mut_ptr();
        let args: Vec<Args<E>> = jobs
            .iter()
            .enumerate()
            .map(|(i, (q, kv, s, vis, rule, _))| Args {
                q,
                kv: *kv,
                s,
                vis: *vis,
                rule: *rule,
                chunks: chunks(s),
                tb,
                kern,
                // SAFETY: job i's records start after those of the jobs before it.
                out: SendPtr(unsafe { base.add(first_unit[i] * per_unit * pw) }),
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
            let recs = &partial[first_unit[i] * per_unit * pw..first_unit[i + 1] * per_unit * pw];
            merge(recs, &args[i], out);
        }
    });
}

/// Merges the partial softmaxes of each (token, head) in slot-range order.
fn merge<E>(partial: &[f32], a: &Args<E>, out: &mut [f32]) {
    let (s, chunks, tb) = (a.s, a.chunks, a.tb);
    let (hd, n_kv) = (s.head_dim, s.n_kv_heads);
    let group = s.n_heads / n_kv;
    let pw = hd + 2;
    for (tg, o) in out.chunks_exact_mut(group * hd).enumerate() {
        // Token t's heads of KV head g: records (t mod tb) of the units of its block.
        let (t, g) = (tg / n_kv, tg % n_kv);
        let unit0 = ((t / tb) * n_kv + g) * chunks;
        for (j, oh) in o.chunks_exact_mut(hd).enumerate() {
            let at = |c: usize| (((unit0 + c) * tb + t % tb) * group + j) * pw;
            let rec = |c: usize| &partial[at(c)..][..pw];
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
    rule: Rule<'a>,
    /// Slot ranges per (token, KV head).
    chunks: usize,
    /// Tokens per unit.
    tb: usize,
    kern: Kernel,
    /// Partial records: per (unit, head) running max, sum of exponentials, unnormalised output.
    out: SendPtr,
}

/// Per-thread buffers of a unit.
#[derive(Default)]
struct UnitScratch {
    /// The block's tokens' slot lists, one after the other; token i's is `ends[i]..ends[i + 1]`.
    slots: Vec<u32>,
    ends: Vec<usize>,
    /// The block's query heads, token by token.
    q: Vec<f32>,
    /// One row of `stride` scores, then probabilities, per query head of the block.
    scores: Vec<f32>,
    /// `heads × 16` scores of one K tile.
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
    /// even dimensions plus odd dimensions, each in dimension order (a scaled type's values
    /// times `ks[(d / 32)·16 + l]`).
    unsafe fn tile_scores<E: AttnElem>(kt: &[E], ks: &[f16], q: &[f32], hd: usize, out: &mut [f32]);
    /// Head `j`'s output `Σ_i p[j·stride + i] · v[slots[i]·hd + d]` for `heads` heads, summed
    /// in slot order, into its record (a scaled type's values times `vs[slots[i]·blocks + d / 32]`);
    /// `cont`: added to the sum the record holds (so a sum split over two calls has the bits of
    /// one call over all its slots).
    unsafe fn weighted_v<E: AttnElem>(
        p: Probs,
        slots: &[u32],
        v: (&[E], &[f16]),
        hd: usize,
        r: Records,
    );
}

/// The probabilities [`Inner::weighted_v`] weighs V rows with: `heads` rows of `stride`
/// floats from `p`, and whether the records' sums go on (`cont`) or start at zero.
#[derive(Clone, Copy)]
struct Probs {
    p: *const f32,
    stride: usize,
    heads: usize,
    cont: bool,
}

struct Portable;
impl Inner for Portable {
    #[inline(always)]
    unsafe fn tile_scores<E: AttnElem>(
        kt: &[E],
        ks: &[f16],
        q: &[f32],
        hd: usize,
        out: &mut [f32],
    ) {
        let k = |d: usize, l: usize| {
            let x = kt[d * KV_TILE + l].get();
            if E::SCALED {
                x * ks[d / QK * KV_TILE + l].to_f32()
            } else {
                x
            }
        };
        for (qh, o) in q.chunks_exact(hd).zip(out.chunks_exact_mut(KV_TILE)) {
            let mut even = [0f32; KV_TILE];
            let mut odd = [0f32; KV_TILE];
            for d in (0..hd).step_by(2) {
                for (l, e) in even.iter_mut().enumerate() {
                    *e += qh[d] * k(d, l);
                }
                if d + 1 < hd {
                    for (l, o) in odd.iter_mut().enumerate() {
                        *o += qh[d + 1] * k(d + 1, l);
                    }
                }
            }
            for l in 0..KV_TILE {
                o[l] = even[l] + odd[l];
            }
        }
    }

    #[inline(always)]
    unsafe fn weighted_v<E: AttnElem>(
        p: Probs,
        slots: &[u32],
        (v, vs): (&[E], &[f16]),
        hd: usize,
        r: Records,
    ) {
        let nb = E::blocks(hd);
        for j in 0..p.heads {
            let o = std::slice::from_raw_parts_mut(r.out.add(j * r.pw + 2), hd);
            if !p.cont {
                o.fill(0.0);
            }
            for (i, &slot) in slots.iter().enumerate() {
                let w = *p.p.add(j * p.stride + i);
                let vr = &v[slot as usize * hd..][..hd];
                for (d, (a, &b)) in o.iter_mut().zip(vr).enumerate() {
                    let x = if E::SCALED {
                        b.get() * vs[slot as usize * nb + d / QK].to_f32()
                    } else {
                        b.get()
                    };
                    *a += w * x;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(target_arch = "x86_64")]
mod avx2;

/// Token `t`'s `c`-th run of [`SLOT_CHUNK`] slots among those it sees, in slot order, onto
/// `slots`: the cached prefix (from the window's start), then its visible new tokens (for a
/// tree: its ancestors, by depth) within the window. A token sees the same sequence of K/V rows
/// whether it runs alone, in a chain or in a tree.
///
/// A paged cache's slots go onto `slots` as its pages' slots (through `table`, the page of
/// each 16-slot tile; empty: slots are themselves). A tile maps to one page and a token's slots
/// leave a tile for good, so whole tiles stay runs of 16 (as `score_slots` takes them) and
/// each token's slots keep their order.
fn visible_slots(
    s: &AttnShape,
    (vis, table): (Visibility, &[u32]),
    win: Option<Window>,
    t: usize,
    c: usize,
    slots: &mut Vec<u32>,
) {
    let (lo, hi) = (c * SLOT_CHUNK, (c + 1) * SLOT_CHUNK);
    let (start, at) = match win {
        Some(w) => {
            let p = w.positions[t].0 as usize;
            ((p + 1).saturating_sub(w.size).min(s.prefix), Some((p, w)))
        }
        None => (0, None),
    };
    let seen = s.prefix - start;
    if lo < seen {
        push_range(slots, start + lo, start + hi.min(seen), table);
    }
    if hi <= seen {
        return;
    }
    let (skip, take) = (lo.saturating_sub(seen), hi - lo.max(seen));
    let near =
        |j: usize| at.is_none_or(|(p, w)| p.saturating_sub(w.positions[j].0 as usize) < w.size);
    let slot = |j: usize| phys(table, s.prefix + j) as u32;
    match vis {
        // New tokens 0..=t: one contiguous run of slots.
        Visibility::Causal if at.is_none() => {
            let end = hi.min(s.prefix + t + 1);
            push_range(slots, lo.max(s.prefix), end.max(lo.max(s.prefix)), table);
        }
        Visibility::Causal => {
            slots.extend((0..=t).filter(|&j| near(j)).skip(skip).take(take).map(slot))
        }
        Visibility::Mask(bits) => slots.extend(
            (0..s.n_new)
                .filter(|&j| bits[t * s.n_new + j] && near(j))
                .skip(skip)
                .take(take)
                .map(slot),
        ),
    }
}

/// Logical slots `a..b` onto `slots`, through `table` a tile at a time.
#[inline]
fn push_range(slots: &mut Vec<u32>, a: usize, b: usize, table: &[u32]) {
    if table.is_empty() {
        slots.extend(a as u32..b as u32);
        return;
    }
    let mut x = a;
    while x < b {
        let t = x / KV_TILE;
        let end = ((t + 1) * KV_TILE).min(b);
        let base = table[t] as usize * KV_TILE - t * KV_TILE;
        slots.extend((base + x) as u32..(base + end) as u32);
        x = end;
    }
}

/// Scaled scores of `q`'s heads (`q.len() / hd` of them) for `slots`, into columns `col..` of
/// rows `stride` apart of `scores`. A slot's score is its lane of its K tile's pass, the same
/// bits whichever heads and slots share the pass.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn score_slots<I: Inner, E: AttnElem>(
    (kh, ksh): (&[E], &[f16]),
    slots: &[u32],
    q: &[f32],
    hd: usize,
    (scale, cap): (f32, f32),
    tile: &mut [f32],
    scores: &mut [f32],
    (stride, col): (usize, usize),
) {
    let heads = q.len() / hd;
    let nb = E::blocks(hd);
    let len = slots.len();
    let mut i = 0;
    while i < len {
        let t = slots[i] as usize / KV_TILE;
        let kt = &kh[t * hd * KV_TILE..][..hd * KV_TILE];
        I::tile_scores(kt, &ksh[t * nb * KV_TILE..][..nb * KV_TILE], q, hd, tile);
        // A whole tile of consecutive slots (most of the cached prefix): its scores in one
        // vector pass per head; the same products as the slot-by-slot loop below.
        let t0 = t * KV_TILE;
        if i + KV_TILE <= len && slots[i + KV_TILE - 1] as usize == t0 + KV_TILE - 1 {
            // Slots rise strictly within a tile (and never come back to one they left), so
            // slots[i..i + 16] are t0..t0 + 16.
            for j in 0..heads {
                let src = &tile[j * KV_TILE..][..KV_TILE];
                let dst = &mut scores[j * stride + col + i..][..KV_TILE];
                if cap == 0.0 {
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d = v * scale;
                    }
                } else {
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d = softcap(v * scale, cap);
                    }
                }
            }
            i += KV_TILE;
            continue;
        }
        while i < len && slots[i] as usize / KV_TILE == t {
            let l = slots[i] as usize % KV_TILE;
            for j in 0..heads {
                let v = tile[j * KV_TILE + l] * scale;
                *scores.get_unchecked_mut(j * stride + col + i) =
                    if cap == 0.0 { v } else { softcap(v, cap) };
            }
            i += 1;
        }
    }
}

/// One unit: the query heads of KV head `g` of the tokens of block `b`, each over the `c`-th
/// range of its visible slots. The slots all the block's tokens see first (the longest common
/// start of their ranges) are scored and summed for all their heads at once; each token's
/// other slots, for its heads alone, continuing the same sums in slot order.
#[inline(always)]
unsafe fn attend<I: Inner, E: AttnElem>(a: &Args<E>, unit: usize, us: &mut UnitScratch) {
    let Args {
        q,
        kv,
        s,
        vis,
        rule,
        chunks,
        tb,
        ..
    } = *a;
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    let scale = (rule.scale, rule.softcap.unwrap_or(0.0));
    let (b, g, c) = (
        unit / (s.n_kv_heads * chunks),
        unit / chunks % s.n_kv_heads,
        unit % chunks,
    );
    let t0 = b * tb;
    let nt = tb.min(s.n_new - t0);
    let UnitScratch {
        slots,
        ends,
        q: qb,
        scores,
        tile,
    } = us;
    slots.clear();
    ends.clear();
    ends.push(0);
    qb.clear();
    for t in t0..t0 + nt {
        visible_slots(s, (vis, kv.table), rule.window, t, c, slots);
        ends.push(slots.len());
        qb.extend_from_slice(&q[(t * s.n_heads + g * group) * hd..][..group * hd]);
    }
    let own = |i: usize| ends[i]..ends[i + 1];
    let first = &slots[own(0)];
    let shared = (1..nt).fold(first.len(), |n, i| {
        first[..n]
            .iter()
            .zip(&slots[own(i)])
            .take_while(|(x, y)| x == y)
            .count()
    });
    let stride = (0..nt).map(|i| own(i).len()).max().unwrap_or(0);
    let heads = nt * group;
    scores.clear();
    scores.resize(heads * stride, f32::NEG_INFINITY);
    tile.resize(heads * KV_TILE, 0.0);
    let nb = E::blocks(hd);
    let kh = &kv.k[g * kv.tiles * hd * KV_TILE..][..kv.tiles * hd * KV_TILE];
    let ksh = &kv.ks[g * kv.tiles * nb * KV_TILE..][..kv.tiles * nb * KV_TILE];
    let kh = (kh, ksh);
    let sh = &slots[..shared];
    score_slots::<I, E>(kh, sh, qb, hd, scale, tile, scores, (stride, 0));
    for i in 0..nt {
        let mine = &slots[ends[i] + shared..ends[i + 1]];
        let qi = &qb[i * group * hd..][..group * hd];
        let rows = &mut scores[i * group * stride..];
        score_slots::<I, E>(kh, mine, qi, hd, scale, tile, rows, (stride, shared));
    }
    // This unit's partial records: m, l, then the unnormalised output.
    let (base, pw) = (a.out.0.add(unit * tb * group * (hd + 2)), hd + 2);
    for j in 0..heads {
        let sc = &mut scores[j * stride..][..own(j / group).len()];
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
    let vh = (
        &kv.v[g * kv.capacity * hd..][..kv.capacity * hd],
        &kv.vs[g * kv.capacity * nb..][..kv.capacity * nb],
    );
    let probs = |at: usize, heads: usize, cont: bool| Probs {
        p: scores.as_ptr().add(at),
        stride,
        heads,
        cont,
    };
    I::weighted_v(
        probs(0, heads, false),
        sh,
        vh,
        hd,
        Records { out: base, pw },
    );
    for i in 0..nt {
        let mine = &slots[ends[i] + shared..ends[i + 1]];
        if !mine.is_empty() {
            let out = base.add(i * group * pw);
            let p = probs(i * group * stride + shared, group, true);
            I::weighted_v(p, mine, vh, hd, Records { out, pw });
        }
    }
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
mod tests;
