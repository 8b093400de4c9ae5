//! AVX-512 VNNI kernels: activation quantization and the `dpbusd` matmul tiles.

use super::{BlockOut, Fmt, Packed, QActs, GROUP, QK};
use crate::runtime::blocks::IQ4_VALUES;
use std::arch::x86_64::*;

/// Activation rows processed together per pass over a row group's weights.
const TILE: usize = 6;

/// Per 32-block: scale = amax / 127, round to nearest even, saturate to ±127.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn quantize(x: &[f32], o: BlockOut) {
    let absmask = _mm512_set1_epi32(0x7FFF_FFFF);
    for (bi, xb) in x.chunks_exact(QK).enumerate() {
        let v0 = _mm512_loadu_ps(xb.as_ptr());
        let v1 = _mm512_loadu_ps(xb.as_ptr().add(16));
        let a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v0), absmask));
        let a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v1), absmask));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
        let d = amax / 127.0;
        let id = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        // |x · id| ≤ 127 up to rounding, so the saturating narrowing never saturates
        // past ±127 and no clamp is needed.
        let b0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, id)));
        let b1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, id)));
        let dst = o.qs.add(bi * QK) as *mut __m128i;
        _mm_storeu_si128(dst, b0);
        _mm_storeu_si128(dst.add(1), b1);
        let flip = _mm_set1_epi8(-128);
        let (u0, u1) = (_mm_xor_si128(b0, flip), _mm_xor_si128(b1, flip));
        let udst = o.us.add(bi * QK) as *mut __m128i;
        _mm_storeu_si128(udst, u0);
        _mm_storeu_si128(udst.add(1), u1);
        // Σ q = Σ (q + 128) − 32 · 128, the unsigned sum by SAD against zero.
        let z = _mm_setzero_si128();
        let sad = _mm_add_epi64(_mm_sad_epu8(u0, z), _mm_sad_epu8(u1, z));
        let usum = _mm_cvtsi128_si64(sad) + _mm_extract_epi64::<1>(sad);
        let sum = usum as i32 - (QK as i32) * 128;
        *o.d.add(bi) = d;
        *o.s.add(bi) = d * sum as f32;
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub unsafe fn matmul_groups(p: &Packed, a: &QActs, g0: usize, g1: usize, out: *mut f32, ld: usize) {
    for g in g0..g1 {
        let mut t0 = 0;
        while t0 < a.n {
            let tn = (a.n - t0).min(TILE);
            let mut acc = [_mm512_setzero_ps(); TILE];
            // Monomorphised per tile height (and format) so the row loop unrolls into
            // independent chains.
            macro_rules! heights {
                ($f:ident $(, $c:expr)*) => {
                    match tn {
                        1 => $f::<1 $(, $c)*>(p, a, g, t0, &mut acc),
                        2 => $f::<2 $(, $c)*>(p, a, g, t0, &mut acc),
                        3 => $f::<3 $(, $c)*>(p, a, g, t0, &mut acc),
                        4 => $f::<4 $(, $c)*>(p, a, g, t0, &mut acc),
                        5 => $f::<5 $(, $c)*>(p, a, g, t0, &mut acc),
                        _ => $f::<6 $(, $c)*>(p, a, g, t0, &mut acc),
                    }
                };
            }
            by_format!(p.fmt, heights);
            store_group(p, g, &acc[..tn], out.add(t0 * ld), ld);
            t0 += tn;
        }
    }
}

/// Group `g`'s outputs of consecutive activation rows (`acc[t]` the row `t` from `out`, rows
/// `ld` apart): the last group's rows past the matrix's end are not written.
#[inline(always)]
pub(super) unsafe fn store_group(p: &Packed, g: usize, acc: &[__m512], out: *mut f32, ld: usize) {
    let r0 = g * GROUP;
    let valid = (p.rows - r0).min(GROUP);
    for (t, v) in acc.iter().enumerate() {
        let dst = out.add(t * ld + r0);
        if valid == GROUP {
            _mm512_storeu_ps(dst, *v);
        } else {
            let mut tmp = [0f32; GROUP];
            _mm512_storeu_ps(tmp.as_mut_ptr(), *v);
            std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, valid);
        }
    }
}

/// Row groups ahead whose weights are prefetched while a group is computed: the stream of
/// weights is read once per forward, and the hardware prefetcher alone leaves the kernel
/// waiting on DRAM.
const PREFETCH_GROUPS: usize = 1;

/// Prefetches the `bytes` (a multiple of 32) at `p` advanced by [`PREFETCH_GROUPS`] groups
/// of `nb` such chunks.
#[inline(always)]
unsafe fn prefetch_ahead(p: *const u8, bytes: usize, nb: usize) {
    let q = p.wrapping_add(PREFETCH_GROUPS * nb * bytes);
    let mut o = 0;
    while o < bytes {
        _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(o) as *const i8);
        o += 64;
    }
}

/// Prefetches what block `gb` of the row group [`PREFETCH_GROUPS`] ahead needs: its weight
/// chunk, its scales and its mins or weight sums.
#[inline(always)]
unsafe fn prefetch_block(p: &Packed, gb: usize, nb: usize) {
    let cb = Packed::chunk_bytes(p.fmt);
    prefetch_ahead(p.q.as_ptr().add(gb * cb), cb, nb);
    match p.fmt {
        Fmt::Q4 | Fmt::Q8 => {
            prefetch_ahead(p.d.as_ptr().add(gb * GROUP) as *const u8, 32, nb);
            let extra = if p.fmt == Fmt::Q8 {
                p.wsum.as_ptr().add(gb * GROUP) as *const u8
            } else {
                p.m.as_ptr().add(gb * GROUP) as *const u8
            };
            prefetch_ahead(extra, 32, nb);
        }
        _ => {
            let per = p.fmt.per_block();
            let at = gb * per * GROUP;
            if !p.qh.is_empty() {
                prefetch_ahead(p.qh.as_ptr().add(gb * 8) as *const u8, 64, nb);
            }
            if !p.hb.is_empty() {
                let hbb = p.fmt.hb_bytes();
                prefetch_ahead(p.hb.as_ptr().add(gb * hbb), hbb, nb);
            }
            prefetch_ahead(p.isc.as_ptr().add(at) as *const u8, 16 * per, nb);
            if !p.imn.is_empty() {
                prefetch_ahead(p.imn.as_ptr().add(at) as *const u8, 16 * per, nb);
            }
            if !p.wsum.is_empty() {
                prefetch_ahead(p.wsum.as_ptr().add(at) as *const u8, 32 * per, nb);
            }
        }
    }
}

/// 16 rows' `d · sc`: f16 block scales at `d` times i8 sub-scales at `sc` (exact products).
#[inline(always)]
unsafe fn sub_scaled(d: *const half::f16, sc: *const i8) -> __m512 {
    let s = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(sc as *const __m128i)));
    _mm512_mul_ps(load_f16x16(d), s)
}

/// 16 rows' i8 sub-scales (or sub-mins) at `sc` as i32.
#[inline(always)]
unsafe fn sub_ints(sc: *const i8) -> __m512i {
    _mm512_cvtepi8_epi32(_mm_loadu_si128(sc as *const __m128i))
}

/// Block `b` of a GGML block with a sub-scale per 16 inputs, per activation row: `sums(t)`
/// gives row `t`'s integer sums of the two halves, which meet their integer sub-scales, are
/// converted once and times the row's block scale into `part`; at the GGML block's last block
/// `part · d` joins `acc`. Per row and block that is two integer multiplies and one fused
/// multiply-add where the sums scaled in f32 take two of each: on a Zen 5 all of them share the
/// ports of the `dpbusd`s (measured: 12 `dpbusd`s with 6 `vpmulld`s or 6 FMAs run 0.73× as
/// fast as alone; conversions and integer adds cost nothing there).
// An index loop: with `iter_mut` the kernel ran ~11 % slower (Zen 5, qmm_compute).
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[inline(always)]
unsafe fn gather_halves<const N: usize>(
    p: &Packed,
    a: &QActs,
    g: usize,
    b: usize,
    t0: usize,
    acc: &mut [__m512; TILE],
    part: &mut [__m512; N],
    sums: impl Fn(usize) -> (__m512i, __m512i),
) {
    let nb = p.cols / QK;
    let at = (g * nb + b) * 2 * GROUP;
    let sc0 = sub_ints(p.isc.as_ptr().add(at));
    let sc1 = sub_ints(p.isc.as_ptr().add(at + GROUP));
    for t in 0..N {
        let dx = _mm512_set1_ps(*a.d.get_unchecked((t0 + t) * nb + b));
        let (i0, i1) = sums(t);
        let i = _mm512_add_epi32(_mm512_mullo_epi32(i0, sc0), _mm512_mullo_epi32(i1, sc1));
        part[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), dx, part[t]);
    }
    if !p.sup_end(b) {
        return;
    }
    let d = load_f16x16(p.sd.as_ptr().add(p.sup_at(g, b)));
    for t in 0..N {
        acc[t] = _mm512_fmadd_ps(part[t], d, acc[t]);
        part[t] = _mm512_setzero_ps();
    }
}

/// A row's two half sums of a block of levels stored with offset `OFF`, the offset taken back
/// with the activations' integer half sums at `hs`.
#[inline(always)]
unsafe fn unoffset<const OFF: i32>(
    s0: __m512i,
    s1: __m512i,
    a: &QActs,
    hs: usize,
) -> (__m512i, __m512i) {
    if OFF == 0 {
        return (s0, s1);
    }
    let off0 = _mm512_set1_epi32(OFF * *a.hs.get_unchecked(hs) as i32);
    let off1 = _mm512_set1_epi32(OFF * *a.hs.get_unchecked(hs + 1) as i32);
    (_mm512_sub_epi32(s0, off0), _mm512_sub_epi32(s1, off1))
}

#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m512i {
    _mm512_set1_epi32((p as *const i32).read_unaligned())
}

#[inline(always)]
unsafe fn load_f16x16(p: *const half::f16) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

/// Two integer accumulators per activation row (low and high nibbles) keep the `dpbusd`
/// dependency chains short; the min term goes to its own f32 accumulator.
#[inline(always)]
unsafe fn q4_tile<const N: usize, const S: bool, const FIVE: bool>(
    p: &Packed,
    a: &QActs,
    g: usize,
    t0: usize,
    acc: &mut [__m512; TILE],
) {
    let nb = p.cols / QK;
    let k = a.k;
    let mask = _mm512_set1_epi8(0x0F);
    let mut accm = [_mm512_setzero_ps(); N];
    for b in 0..nb {
        let gb = g * nb + b;
        let base = p.q.as_ptr().add(gb * 256);
        if t0 == 0 {
            prefetch_block(p, gb, nb);
        }
        let mut lo = [_mm512_setzero_si512(); 4];
        let mut hi = [_mm512_setzero_si512(); 4];
        for i in 0..4 {
            let w = _mm512_loadu_si512(base.add(i * 64) as *const _);
            lo[i] = _mm512_and_si512(w, mask);
            hi[i] = _mm512_and_si512(_mm512_srli_epi16(w, 4), mask);
            if FIVE {
                // The fifth bits: +16 on the bytes whose mask bit is set.
                let sixteen = _mm512_set1_epi8(16);
                let qh = p.qh.as_ptr().add(gb * 8 + 2 * i);
                lo[i] = _mm512_mask_add_epi8(lo[i], *qh, lo[i], sixteen);
                hi[i] = _mm512_mask_add_epi8(hi[i], *qh.add(1), hi[i], sixteen);
            }
        }
        let (dw, mw) = if S {
            let sup = p.sup_at(g, b);
            (
                sub_scaled(p.sd.as_ptr().add(sup), p.isc.as_ptr().add(gb * GROUP)),
                sub_scaled(p.sm.as_ptr().add(sup), p.imn.as_ptr().add(gb * GROUP)),
            )
        } else {
            (
                load_f16x16(p.d.as_ptr().add(gb * GROUP)),
                load_f16x16(p.m.as_ptr().add(gb * GROUP)),
            )
        };
        // Integer partial sums are exact, so how they are split into chains (two per row
        // for few rows, one when rows alone give enough independent chains) never changes
        // a result: a row's output does not depend on the tile it was computed in.
        let mut s0 = [_mm512_setzero_si512(); N];
        let mut s1 = [_mm512_setzero_si512(); N];
        for i in 0..4 {
            for t in 0..N {
                let y = a.qs.as_ptr().add((t0 + t) * k + b * QK) as *const u8;
                s0[t] = _mm512_dpbusd_epi32(s0[t], lo[i], bcast4(y.add(4 * i)));
                if N <= 2 {
                    s1[t] = _mm512_dpbusd_epi32(s1[t], hi[i], bcast4(y.add(16 + 4 * i)));
                } else {
                    s0[t] = _mm512_dpbusd_epi32(s0[t], hi[i], bcast4(y.add(16 + 4 * i)));
                }
            }
        }
        for t in 0..N {
            let row = t0 + t;
            let dx = _mm512_set1_ps(*a.d.get_unchecked(row * nb + b));
            let sx = _mm512_set1_ps(*a.s.get_unchecked(row * nb + b));
            let s = _mm512_add_epi32(s0[t], s1[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, dx), acc[t]);
            accm[t] = _mm512_fmadd_ps(mw, sx, accm[t]);
        }
    }
    for t in 0..N {
        acc[t] = _mm512_add_ps(acc[t], accm[t]);
    }
}

/// Levels with a sub-scale per 16 inputs, stored unsigned as level + `OFF` in `W` bits: six
/// (`Q6S`: nibbles and a plane of two high bits), three (`Q3S`: two bits four a byte and a plane
/// of third bits) or two with a min per 16 (`Q2S`: `MIN`). Each half of a block (its first and
/// last 16 inputs) has its own `dpbusd` chain (unsigned levels × signed activations); the offset
/// is taken back with the activations' integer half sums. The integer sums and the f32 epilogue
/// are those of an int8 expansion of the same levels (`q8_tile` with halves), bit for bit.
#[inline(always)]
unsafe fn q6_tile<const N: usize, const W: u32, const OFF: i32, const MIN: bool>(
    p: &Packed,
    a: &QActs,
    g: usize,
    t0: usize,
    acc: &mut [__m512; TILE],
) {
    let nb = p.cols / QK;
    let k = a.k;
    let mask = _mm512_set1_epi8(0x0F);
    let high = _mm512_set1_epi8(0x30);
    let mut accm = [_mm512_setzero_ps(); N];
    let mut part = [_mm512_setzero_ps(); N];
    let (cb, hbb) = (Packed::chunk_bytes(p.fmt), p.fmt.hb_bytes());
    for b in 0..nb {
        let gb = g * nb + b;
        let base = p.q.as_ptr().add(gb * cb);
        let hb = p.hb.as_ptr().wrapping_add(gb * hbb);
        if t0 == 0 {
            prefetch_block(p, gb, nb);
        }
        let mut lo = [_mm512_setzero_si512(); 4];
        let mut hi = [_mm512_setzero_si512(); 4];
        if W <= 3 {
            // Register 0 holds the first 16 inputs' levels, register 1 the last 16: step i at
            // bits 2i..2i + 2 of each byte.
            let three = _mm512_set1_epi8(3);
            for (r, dst) in [&mut lo, &mut hi].into_iter().enumerate() {
                let w = _mm512_loadu_si512(base.add(r * 64) as *const _);
                dst[0] = _mm512_and_si512(w, three);
                dst[1] = _mm512_and_si512(_mm512_srli_epi16(w, 2), three);
                dst[2] = _mm512_and_si512(_mm512_srli_epi16(w, 4), three);
                dst[3] = _mm512_and_si512(_mm512_srli_epi16(w, 6), three);
            }
        }
        if W == 3 {
            // The third bit of step s of half r sits at bit 4r + s; each goes to bit 2 (16-bit
            // shifts: what crosses a byte is masked off), `w | (x & 4)` one ternary-logic op.
            let h = _mm512_loadu_si512(hb as *const _);
            let four = _mm512_set1_epi8(4);
            let bits = [
                _mm512_slli_epi16(h, 2),
                _mm512_slli_epi16(h, 1),
                h,
                _mm512_srli_epi16(h, 1),
                _mm512_srli_epi16(h, 2),
                _mm512_srli_epi16(h, 3),
                _mm512_srli_epi16(h, 4),
                _mm512_srli_epi16(h, 5),
            ];
            for s in 0..4 {
                lo[s] = _mm512_ternarylogic_epi32(lo[s], bits[s], four, 0xF8);
                hi[s] = _mm512_ternarylogic_epi32(hi[s], bits[4 + s], four, 0xF8);
            }
        }
        for r in 0..(if W == 6 { 2 } else { 0 }) {
            let h = _mm512_loadu_si512(hb.add(r * 64) as *const _);
            // Chunk 2r's high bits sit at bits 0–1 (low nibbles) and 2–3 (high ones), chunk
            // 2r + 1's at 4–5 and 6–7; each goes to bits 4–5 of its byte (16-bit shifts: what
            // crosses a byte is masked off). `w | (x & 0x30)` is one ternary-logic op.
            let h0 = _mm512_slli_epi16(h, 4);
            let h1 = _mm512_slli_epi16(h, 2);
            let h3 = _mm512_srli_epi16(h, 2);
            for (s, (hl, hh)) in [(h0, h1), (h, h3)].into_iter().enumerate() {
                let i = 2 * r + s;
                let w = _mm512_loadu_si512(base.add(i * 64) as *const _);
                let wl = _mm512_and_si512(w, mask);
                let wh = _mm512_and_si512(_mm512_srli_epi16(w, 4), mask);
                lo[i] = _mm512_ternarylogic_epi32(wl, hl, high, 0xF8);
                hi[i] = _mm512_ternarylogic_epi32(wh, hh, high, 0xF8);
            }
        }
        let mut s0 = [_mm512_setzero_si512(); N];
        let mut s1 = [_mm512_setzero_si512(); N];
        for i in 0..4 {
            for t in 0..N {
                let y = a.qs.as_ptr().add((t0 + t) * k + b * QK) as *const u8;
                s0[t] = _mm512_dpbusd_epi32(s0[t], lo[i], bcast4(y.add(4 * i)));
                s1[t] = _mm512_dpbusd_epi32(s1[t], hi[i], bcast4(y.add(16 + 4 * i)));
            }
        }
        let at = gb * 2 * GROUP;
        if !MIN {
            gather_halves(p, a, g, b, t0, acc, &mut part, |t| {
                unoffset::<OFF>(s0[t], s1[t], a, ((t0 + t) * nb + b) * 2)
            });
            continue;
        }
        let sup = p.sup_at(g, b);
        let dw0 = sub_scaled(p.sd.as_ptr().add(sup), p.isc.as_ptr().add(at));
        let dw1 = sub_scaled(p.sd.as_ptr().add(sup), p.isc.as_ptr().add(at + GROUP));
        let (m0, m1) = if MIN {
            (
                sub_scaled(p.sm.as_ptr().add(sup), p.imn.as_ptr().add(at)),
                sub_scaled(p.sm.as_ptr().add(sup), p.imn.as_ptr().add(at + GROUP)),
            )
        } else {
            (_mm512_setzero_ps(), _mm512_setzero_ps())
        };
        for t in 0..N {
            let row = t0 + t;
            let dx = _mm512_set1_ps(*a.d.get_unchecked(row * nb + b));
            let hs = (row * nb + b) * 2;
            let (i0, i1) = unoffset::<OFF>(s0[t], s1[t], a, hs);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), _mm512_mul_ps(dw0, dx), acc[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), _mm512_mul_ps(dw1, dx), acc[t]);
            if MIN {
                accm[t] = _mm512_fmadd_ps(m0, _mm512_set1_ps(*a.h.get_unchecked(hs)), accm[t]);
                accm[t] = _mm512_fmadd_ps(m1, _mm512_set1_ps(*a.h.get_unchecked(hs + 1)), accm[t]);
            }
        }
    }
    if MIN {
        for t in 0..N {
            acc[t] = _mm512_add_ps(acc[t], accm[t]);
        }
    }
}

/// IQ4 levels (`Q4T`): each nibble indexes the table of 16 int8 levels (a byte shuffle), then
/// the levels meet the unsigned activations as int8 weights do, taken back with the level
/// sums; the sums and epilogue of `q8_tile` with sub-scales per 32, bit for bit.
#[inline(always)]
unsafe fn q4t_tile<const N: usize>(
    p: &Packed,
    a: &QActs,
    g: usize,
    t0: usize,
    acc: &mut [__m512; TILE],
) {
    let nb = p.cols / QK;
    let k = a.k;
    let mask = _mm512_set1_epi8(0x0F);
    let table = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4_VALUES.as_ptr() as *const __m128i));
    for b in 0..nb {
        let gb = g * nb + b;
        let base = p.q.as_ptr().add(gb * 256);
        if t0 == 0 {
            prefetch_block(p, gb, nb);
        }
        let mut lo = [_mm512_setzero_si512(); 4];
        let mut hi = [_mm512_setzero_si512(); 4];
        for i in 0..4 {
            let w = _mm512_loadu_si512(base.add(i * 64) as *const _);
            lo[i] = _mm512_shuffle_epi8(table, _mm512_and_si512(w, mask));
            hi[i] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(w, 4), mask));
        }
        let mut s0 = [_mm512_setzero_si512(); N];
        let mut s1 = [_mm512_setzero_si512(); N];
        for i in 0..4 {
            for t in 0..N {
                let u = a.us.as_ptr().add((t0 + t) * k + b * QK);
                s0[t] = _mm512_dpbusd_epi32(s0[t], bcast4(u.add(4 * i)), lo[i]);
                if N <= 2 {
                    s1[t] = _mm512_dpbusd_epi32(s1[t], bcast4(u.add(16 + 4 * i)), hi[i]);
                } else {
                    s0[t] = _mm512_dpbusd_epi32(s0[t], bcast4(u.add(16 + 4 * i)), hi[i]);
                }
            }
        }
        let wsum = _mm512_slli_epi32(
            _mm512_cvtepi16_epi32(_mm256_loadu_si256(
                p.wsum.as_ptr().add(gb * GROUP) as *const __m256i
            )),
            7,
        );
        let dw = sub_scaled(
            p.sd.as_ptr().add(p.sup_at(g, b)),
            p.isc.as_ptr().add(gb * GROUP),
        );
        for t in 0..N {
            let dx = _mm512_set1_ps(*a.d.get_unchecked((t0 + t) * nb + b));
            let s = _mm512_sub_epi32(_mm512_add_epi32(s0[t], s1[t]), wsum);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, dx), acc[t]);
        }
    }
}

/// Int8 weights: Q8_0 (an f16 scale per 32 inputs), or levels with sub-scales (`S`) per 32
/// inputs or per 16 (`HALVES`: each half of the block its own integer sum, scale and weight
/// sum) and a min term (`MIN`). The unsigned operand is the activation shifted by 128, taken
/// back with the weight sums. The float operations per row are the same whatever the tile
/// height.
#[inline(always)]
unsafe fn q8_tile<const N: usize, const S: bool, const HALVES: bool, const MIN: bool>(
    p: &Packed,
    a: &QActs,
    g: usize,
    t0: usize,
    acc: &mut [__m512; TILE],
) {
    let nb = p.cols / QK;
    let k = a.k;
    let per = if HALVES { 2 } else { 1 };
    let mut accm = [_mm512_setzero_ps(); N];
    let mut part = [_mm512_setzero_ps(); N];
    for b in 0..nb {
        let gb = g * nb + b;
        let base = p.q.as_ptr().add(gb * 512);
        if t0 == 0 {
            prefetch_block(p, gb, nb);
        }
        let at = gb * per * GROUP;
        let wsum = |h: usize| {
            _mm512_slli_epi32(
                _mm512_cvtepi16_epi32(_mm256_loadu_si256(
                    p.wsum.as_ptr().add(at + h * GROUP) as *const __m256i
                )),
                7,
            )
        };
        let mut s0 = [_mm512_setzero_si512(); N];
        let mut s1 = [_mm512_setzero_si512(); N];
        for i in 0..4 {
            let w0 = _mm512_loadu_si512(base.add(i * 64) as *const _);
            let w1 = _mm512_loadu_si512(base.add((i + 4) * 64) as *const _);
            for t in 0..N {
                let u = a.us.as_ptr().add((t0 + t) * k + b * QK);
                s0[t] = _mm512_dpbusd_epi32(s0[t], bcast4(u.add(4 * i)), w0);
                if HALVES || N <= 2 {
                    s1[t] = _mm512_dpbusd_epi32(s1[t], bcast4(u.add(16 + 4 * i)), w1);
                } else {
                    s0[t] = _mm512_dpbusd_epi32(s0[t], bcast4(u.add(16 + 4 * i)), w1);
                }
            }
        }
        if S && HALVES && !MIN {
            // Q6_K's and Q3_K's expansion: the epilogue of `q6_tile`.
            let (w0, w1) = (wsum(0), wsum(1));
            gather_halves(p, a, g, b, t0, acc, &mut part, |t| {
                (_mm512_sub_epi32(s0[t], w0), _mm512_sub_epi32(s1[t], w1))
            });
            continue;
        }
        let sup = p.sup_at(g, b);
        let dw0 = if S {
            sub_scaled(p.sd.as_ptr().add(sup), p.isc.as_ptr().add(at))
        } else {
            load_f16x16(p.d.as_ptr().add(gb * GROUP))
        };
        for t in 0..N {
            let row = t0 + t;
            let dx = _mm512_set1_ps(*a.d.get_unchecked(row * nb + b));
            if HALVES {
                let dw1 = sub_scaled(p.sd.as_ptr().add(sup), p.isc.as_ptr().add(at + GROUP));
                let i0 = _mm512_sub_epi32(s0[t], wsum(0));
                let i1 = _mm512_sub_epi32(s1[t], wsum(1));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), _mm512_mul_ps(dw0, dx), acc[t]);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), _mm512_mul_ps(dw1, dx), acc[t]);
                if MIN {
                    let h = (row * nb + b) * 2;
                    let m0 = sub_scaled(p.sm.as_ptr().add(sup), p.imn.as_ptr().add(at));
                    let m1 = sub_scaled(p.sm.as_ptr().add(sup), p.imn.as_ptr().add(at + GROUP));
                    accm[t] = _mm512_fmadd_ps(m0, _mm512_set1_ps(*a.h.get_unchecked(h)), accm[t]);
                    accm[t] =
                        _mm512_fmadd_ps(m1, _mm512_set1_ps(*a.h.get_unchecked(h + 1)), accm[t]);
                }
            } else {
                let s = _mm512_sub_epi32(_mm512_add_epi32(s0[t], s1[t]), wsum(0));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw0, dx), acc[t]);
                if MIN {
                    let m0 = sub_scaled(p.sm.as_ptr().add(sup), p.imn.as_ptr().add(at));
                    let sx = _mm512_set1_ps(*a.s.get_unchecked(row * nb + b));
                    accm[t] = _mm512_fmadd_ps(m0, sx, accm[t]);
                }
            }
        }
    }
    if MIN {
        for t in 0..N {
            acc[t] = _mm512_add_ps(acc[t], accm[t]);
        }
    }
}
