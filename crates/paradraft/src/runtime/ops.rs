//! Element-wise and attention kernels (portable reference implementations).

use super::quant::SendPtr;
use crate::types::TokenId;
use std::cell::RefCell;

multiversion! {
    /// `out = x / rms(x) · w`, one row at a time (`x.len()` a multiple of `w.len()`).
    pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        let d = w.len();
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let ss = super::quant::dot(xr, xr) / d as f32;
            let s = 1.0 / (ss + eps).sqrt();
            for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
                *o = v * s * g;
            }
        }
    }
}

/// In-place RMSNorm of each `w.len()`-wide chunk (per-head q/k norm).
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for xr in x.chunks_exact_mut(d) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let s = 1.0 / (ss + eps).sqrt();
        for (v, &g) in xr.iter_mut().zip(w) {
            *v = *v * s * g;
        }
    }
}

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (2i, 2i+1): GGML's "normal" rope, used by GGUF Llama files (whose q/k rows the
    /// converter permuted).
    Interleaved,
    /// Pairs (i, i + d/2): HF `rotate_half` / GGML "neox" rope.
    Half,
}

/// Rotates every head of one token in place. `cs` holds `(cos, sin)` for the token's
/// position, one pair per frequency (`head_dim / 2`).
pub fn rope(x: &mut [f32], head_dim: usize, cs: &[(f32, f32)], style: RopeStyle) {
    let half = head_dim / 2;
    for h in x.chunks_exact_mut(head_dim) {
        for (i, &(c, s)) in cs.iter().enumerate().take(half) {
            let (a, b) = match style {
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                RopeStyle::Half => (i, i + half),
            };
            let (x0, x1) = (h[a], h[b]);
            h[a] = x0 * c - x1 * s;
            h[b] = x0 * s + x1 * c;
        }
    }
}

multiversion! {
    /// `gate = silu(gate) · up`, in place.
    pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
        for (g, &u) in gate.iter_mut().zip(up) {
            *g = *g / (1.0 + fast_exp(-*g)) * u;
        }
    }
}

multiversion! {
    pub fn add_inplace(x: &mut [f32], y: &[f32]) {
        for (a, &b) in x.iter_mut().zip(y) {
            *a += b;
        }
    }
}

/// Index of the largest value; ties go to the lowest index (deterministic greedy).
pub fn argmax(x: &[f32]) -> TokenId {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    TokenId(best as u32)
}

/// The `k` largest values, descending, ties broken by lower id first.
pub fn top_k(x: &[f32], k: usize) -> Vec<(TokenId, f32)> {
    let k = k.min(x.len());
    let mut idx: Vec<u32> = (0..x.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| x[*b as usize].total_cmp(&x[*a as usize]).then(a.cmp(b));
    if k < idx.len() && k > 0 {
        idx.select_nth_unstable_by(k - 1, cmp);
    }
    idx.truncate(k);
    idx.sort_by(cmp);
    idx.into_iter()
        .map(|i| (TokenId(i), x[i as usize]))
        .collect()
}

/// Slots per split-K range of attention.
pub const SLOT_CHUNK: usize = 128;

/// Geometry of one attention call.
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

/// e^x for f32 without libm, written so that loops over it vectorise: range reduction to
/// x = n·ln2 + r, |r| ≤ ln2/2, a degree-6 polynomial for e^r, and 2^n through the exponent bits.
/// Relative error below 1e-6 on [-87, 88]; inputs below −87 (and −∞) give exactly 0.
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    let xc = x.clamp(-87.0, 88.0);
    let n = (xc * std::f32::consts::LOG2_E + 12_582_912.0) - 12_582_912.0;
    let r = xc - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (0.166_666_67
                    + r * (0.041_666_668 + r * (0.008_333_334 + r * 0.001_388_888_9)))));
    let e = p * f32::from_bits(((n as i32 + 127) as u32) << 23);
    if x < -87.0 {
        0.0
    } else {
        e
    }
}

/// Attention of `n_new` queries over the cache. `q` is `[n_new, n_heads, head_dim]`; `k`/`v` are
/// the layer's cache `[slots, n_kv_heads, head_dim]`. One task per (new token, KV head): the
/// query heads sharing a KV head (GQA) read each K/V row once, without copying.
pub fn attention(q: &[f32], k: &[f32], v: &[f32], s: &AttnShape, vis: Visibility, out: &mut [f32]) {
    // Work units are (token, KV head, range of SLOT_CHUNK slots); the query heads sharing a KV
    // head are done together so each K/V row is read once, and the slot ranges (split-K) give
    // every thread work even in decode. Each range yields an unnormalised partial softmax,
    // merged in slot order afterwards. The ranges are fixed by slot index, so a token's result
    // does not depend on how many tokens share the forward: batched verification reproduces
    // token-by-token decoding bit for bit.
    let threads = super::pool::threads();
    let (hd, group) = (s.head_dim, s.n_heads / s.n_kv_heads);
    let total = s.prefix + s.n_new;
    let chunks = total.div_ceil(SLOT_CHUNK);
    let units = s.n_new * s.n_kv_heads * chunks;
    assert_eq!(out.len(), s.n_new * s.n_heads * hd);
    thread_local! {
        static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
        static PARTIAL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    }
    let pw = hd + 2;
    PARTIAL.with_borrow_mut(|partial| {
        partial.resize(units * group * pw, 0.0);
        let args = AttnArgs {
            q,
            k,
            v,
            s,
            vis,
            chunks,
            out: SendPtr(partial.as_mut_ptr()),
        };
        let tasks = (threads * 4).min(units);
        super::pool::run(tasks, |task| {
            SCORES.with_borrow_mut(|scores| {
                for unit in task * units / tasks..(task + 1) * units / tasks {
                    // SAFETY: each unit writes only its own partial records.
                    unsafe { attend_dispatch(&args, unit, scores) };
                }
            })
        });
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
    });
}

struct AttnArgs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    s: &'a AttnShape,
    vis: Visibility<'a>,
    /// Slot ranges per (token, KV head).
    chunks: usize,
    /// Partial records: per (unit, head) running max, sum of exponentials, unnormalised output.
    out: SendPtr,
}

unsafe fn attend_dispatch(a: &AttnArgs, pair: usize, scores: &mut Vec<f32>) {
    use super::qmatmul::{isa, Isa};
    match isa() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => attend_avx512(a, pair, scores),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => attend_avx2(a, pair, scores),
        _ => attend::<PortableDot>(a, pair, scores),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn attend_avx512(a: &AttnArgs, pair: usize, scores: &mut Vec<f32>) {
    attend::<Avx512Dot>(a, pair, scores)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(a: &AttnArgs, pair: usize, scores: &mut Vec<f32>) {
    attend::<PortableDot>(a, pair, scores)
}

/// The q·k product of the attention inner loop, per instruction set.
trait HeadDot {
    unsafe fn dot(a: &[f32], b: &[f32]) -> f32;
}

struct PortableDot;
impl HeadDot for PortableDot {
    #[inline(always)]
    unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        super::quant::dot(a, b)
    }
}

#[cfg(target_arch = "x86_64")]
struct Avx512Dot;
#[cfg(target_arch = "x86_64")]
impl HeadDot for Avx512Dot {
    /// Two independent 16-lane FMA chains, one horizontal reduction.
    #[inline(always)]
    unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        use std::arch::x86_64::*;
        let n = a.len().min(b.len());
        let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut i = 0;
        while i + 32 <= n {
            s0 = _mm512_fmadd_ps(
                _mm512_loadu_ps(a.as_ptr().add(i)),
                _mm512_loadu_ps(b.as_ptr().add(i)),
                s0,
            );
            s1 = _mm512_fmadd_ps(
                _mm512_loadu_ps(a.as_ptr().add(i + 16)),
                _mm512_loadu_ps(b.as_ptr().add(i + 16)),
                s1,
            );
            i += 32;
        }
        let mut r = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
        while i < n {
            r += a[i] * b[i];
            i += 1;
        }
        r
    }
}

/// One (new token, KV head) pair: its query heads' softmax over the visible slots.
#[inline(always)]
unsafe fn attend<D: HeadDot>(a: &AttnArgs, unit: usize, scores: &mut Vec<f32>) {
    let AttnArgs {
        q,
        k,
        v,
        s,
        vis,
        chunks,
        ..
    } = *a;
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    let kv_stride = s.n_kv_heads * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let (t, g, c) = (
        unit / (s.n_kv_heads * chunks),
        unit / chunks % s.n_kv_heads,
        unit % chunks,
    );
    // The c-th run of SLOT_CHUNK slots among those this token sees, in slot order: the cached
    // prefix, then its visible new tokens (for a tree: its ancestors, by depth). A token sees
    // the same sequence of K/V rows whether it runs alone, in a chain or in a tree, so its
    // arithmetic (chunking included) is the same.
    let new_visible = |j: &usize| match vis {
        Visibility::Causal => *j <= t,
        Visibility::Mask(bits) => bits[t * s.n_new + j],
    };
    thread_local! {
        static SLOTS: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    }
    let mut slots = SLOTS.with_borrow_mut(std::mem::take);
    slots.clear();
    slots.extend(
        (0..s.prefix)
            .chain((0..s.n_new).filter(new_visible).map(|j| s.prefix + j))
            .skip(c * SLOT_CHUNK)
            .take(SLOT_CHUNK),
    );
    let len = slots.len();
    scores.clear();
    scores.resize(group * len, f32::NEG_INFINITY);
    let h0 = g * group;
    let qs = &q[(t * s.n_heads + h0) * hd..(t * s.n_heads + h0 + group) * hd];
    for (i, &slot) in slots.iter().enumerate() {
        let kr = &k[slot * kv_stride + g * hd..slot * kv_stride + (g + 1) * hd];
        for (j, qh) in qs.chunks_exact(hd).enumerate() {
            *scores.get_unchecked_mut(j * len + i) = D::dot(qh, kr) * scale;
        }
    }
    let mut stats = [(0f32, 0f32); 16];
    let mut stats_v = Vec::new();
    let stats: &mut [(f32, f32)] = if group <= 16 {
        &mut stats[..group]
    } else {
        stats_v.resize(group, (0f32, 0f32));
        &mut stats_v
    };
    for (j, st) in stats.iter_mut().enumerate() {
        let sc = &mut scores[j * len..(j + 1) * len];
        let max = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        if max > f32::NEG_INFINITY {
            for x in sc.iter_mut() {
                *x = fast_exp(*x - max);
                sum += *x;
            }
        }
        *st = (max, sum);
    }
    // This unit's partial records: m, l, then the unnormalised output.
    let (base, stride, off) = (a.out.0.add(unit * group * (hd + 2)), hd + 2, 2);
    for (j, &(m, l)) in stats.iter().enumerate() {
        let row = std::slice::from_raw_parts_mut(base.add(j * stride), stride);
        row[0] = m;
        row[1] = l;
        row[off..].fill(0.0);
    }
    for (i, &slot) in slots.iter().enumerate() {
        let vr = &v[slot * kv_stride + g * hd..slot * kv_stride + (g + 1) * hd];
        for j in 0..group {
            let p = *scores.get_unchecked(j * len + i);
            let oh = std::slice::from_raw_parts_mut(base.add(j * stride + off), hd);
            for (a, &b) in oh.iter_mut().zip(vr) {
                *a += p * b;
            }
        }
    }
    SLOTS.with_borrow_mut(|s| *s = slots);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_accurate() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (fast_exp(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 1e-6, "max relative error {worst}");
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(-1e30), 0.0);
    }

    #[test]
    fn argmax_ties_go_low() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), TokenId(1));
    }

    #[test]
    fn top_k_sorted_with_ties() {
        let t = top_k(&[1.0, 3.0, 3.0, 2.0, 0.5], 3);
        assert_eq!(
            t,
            vec![(TokenId(1), 3.0), (TokenId(2), 3.0), (TokenId(3), 2.0)]
        );
    }

    #[test]
    fn rope_styles_rotate_norm_preserving() {
        let mut a = vec![1.0, 2.0, 3.0, 4.0];
        let cs = [(0.6f32, 0.8f32), (0.0, 1.0)];
        rope(&mut a, 4, &cs, RopeStyle::Half);
        // pair (0,2): (1,3) rotated by (0.6,0.8) → (1·0.6−3·0.8, 1·0.8+3·0.6)
        assert!((a[0] - (0.6 - 2.4)).abs() < 1e-6 && (a[2] - (0.8 + 1.8)).abs() < 1e-6);
        // pair (1,3): (2,4) rotated by 90° → (−4, 2)
        assert!((a[1] + 4.0).abs() < 1e-6 && (a[3] - 2.0).abs() < 1e-6);
    }
}
