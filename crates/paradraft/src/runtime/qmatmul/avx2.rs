//! 256-bit kernels: activation quantization and the int8 matmul tiles, with AVX2's `maddubs`
//! or with 256-bit VNNI (`vpdpbusd`: AVX-VNNI's VEX encoding, or AVX-512 VNNI's EVEX one).
//!
//! A 256-bit register holds 4 consecutive weights of 8 rows (half of a 16-row group), so a
//! tile is (halves × activation rows): each weight register is loaded and unpacked once for all
//! the tile's activation rows, and each activation row's broadcasts serve all its halves.
//! Decode (one activation row) takes both halves of a group at once for independent chains.
//!
//! AVX2, Q4: `maddubs` (u8 nibble · s8 activation → i16 pairs) is exact here, and so is summing
//! the 8 products of a block in i16 (|Σ| ≤ 8 · 2 · 15 · 127 = 30 480), so one `madd` per
//! (row, block) widens to i32. Q8: the sign trick (|w| · sign(y, w)) keeps `maddubs` from
//! saturating; each product pair is widened at once (2 · 128 · 127 = 32 512 leaves no room).
//! VNNI sums 4 products into i32 lanes directly; for Q8 the unsigned operand is the activation
//! shifted by 128, corrected by the weights' sums as in the AVX-512 kernel.
//!
//! Every (row, activation row) runs the same integer sums and the same f32 epilogue whatever
//! tile it is computed in, so a row's output never depends on the batch it came in.

use super::{BlockOut, Fmt, Packed, QActs, GROUP, QK};
use crate::runtime::blocks::IQ4_VALUES;
use std::arch::x86_64::*;

/// Per 32-block: scale = amax / 127, round to nearest even, saturate to ±127 (bit for bit the
/// portable function).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize(x: &[f32], o: BlockOut) {
    let absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let flip = _mm256_set1_epi8(-128);
    for (bi, xb) in x.chunks_exact(QK).enumerate() {
        let p = xb.as_ptr();
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let a01 = _mm256_max_ps(_mm256_and_ps(v[0], absmask), _mm256_and_ps(v[1], absmask));
        let a23 = _mm256_max_ps(_mm256_and_ps(v[2], absmask), _mm256_and_ps(v[3], absmask));
        let m8 = _mm256_max_ps(a01, a23);
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps::<1>(m8));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m1 = _mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2));
        let amax = _mm_cvtss_f32(m1);
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        // Round to nearest even (the default MXCSR mode); |x · id| ≤ 127 up to rounding, so
        // the saturating packs never saturate past ±127.
        let q = |i: usize| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
        let p01 = _mm256_packs_epi32(q(0), q(1));
        let p23 = _mm256_packs_epi32(q(2), q(3));
        // packs works within 128-bit lanes: dwords come out as a0 b0 c0 d0 a1 b1 c1 d1.
        let b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), order);
        _mm256_storeu_si256(o.qs.add(bi * QK) as *mut __m256i, b);
        let u = _mm256_xor_si256(b, flip);
        _mm256_storeu_si256(o.us.add(bi * QK) as *mut __m256i, u);
        // Σ q = Σ (q + 128) − 32 · 128, the unsigned sum by SAD against zero.
        let sad = _mm256_sad_epu8(u, _mm256_setzero_si256());
        let s2 = _mm_add_epi64(
            _mm256_castsi256_si128(sad),
            _mm256_extracti128_si256::<1>(sad),
        );
        let usum = _mm_cvtsi128_si64(s2) + _mm_extract_epi64::<1>(s2);
        let sum = usum as i32 - (QK as i32) * 128;
        *o.d.add(bi) = d;
        *o.s.add(bi) = d * sum as f32;
    }
}

/// Most activation rows per tile (with one half of a group) for AVX2. On a Zen 3 (AVX2 only,
/// one core, weights in L2; `tile_shapes`, interleaved) 16-row tiles ran Q4_1 at 16 rows
/// 5–10 % faster than 4-row ones and Q8_0 3–5 % slower, 8-row tiles no faster; but whole
/// forwards (`bench-kernels`, Q4_1 layers in 16-row tiles, two interleaved rounds) showed no
/// difference within that VM's noise, so tiles stay at 4 rows. (On a Zen 4 forced to AVX2, 6
/// rows had measured no faster than 4.)
const MADDUBS_TILE: usize = 4;

/// Up to this many activation rows, a tile takes both halves of a group (as decode does): two
/// rows ran 12–18 % faster that way on a Zen 3 (Q4_1 and Q8_0, weights in L2 and beyond;
/// `tile_shapes`, interleaved), three rows no faster.
const WIDE_ROWS: usize = 2;

/// VNNI's tile (two chains per row): not measured wider.
const VNNI_TILE: usize = 4;

#[path = "avx2_dot.rs"]
mod dot;
use dot::{Dot, Evex, Maddubs, Vex, Vnni};

/// AVX2 (`maddubs`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn matmul_groups(p: &Packed, a: &QActs, g0: usize, g1: usize, out: *mut f32, ld: usize) {
    groups::<Maddubs, MADDUBS_TILE, WIDE_ROWS>(p, a, g0, g1, out, ld)
}

/// AVX-VNNI (VEX encoding: Intel Alder Lake and later).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn matmul_groups_vnni_vex(
    p: &Packed,
    a: &QActs,
    g0: usize,
    g1: usize,
    out: *mut f32,
    ld: usize,
) {
    groups::<Vnni<Vex>, VNNI_TILE, 1>(p, a, g0, g1, out, ld)
}

/// 256-bit VNNI through AVX-512 VL (CPUs with AVX-512 VNNI but no AVX-VNNI, e.g. Zen 4).
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub unsafe fn matmul_groups_vnni_evex(
    p: &Packed,
    a: &QActs,
    g0: usize,
    g1: usize,
    out: *mut f32,
    ld: usize,
) {
    groups::<Vnni<Evex>, VNNI_TILE, 1>(p, a, g0, g1, out, ld)
}

#[inline(always)]
unsafe fn groups<D: Dot, const TILE: usize, const WIDE: usize>(
    p: &Packed,
    a: &QActs,
    g0: usize,
    g1: usize,
    out: *mut f32,
    ld: usize,
) {
    for g in g0..g1 {
        let r0 = g * GROUP;
        // Decode (one row) and up to WIDE rows: both halves at once, independent chains.
        if a.n <= WIDE.max(1) {
            match a.n {
                1 => tile::<D, 2, 1>(p, a, g, 0, 0, out, ld),
                2 => tile::<D, 2, 2>(p, a, g, 0, 0, out, ld),
                _ => tile::<D, 2, 3>(p, a, g, 0, 0, out, ld),
            }
            continue;
        }
        for h in 0..2 {
            if r0 + 8 * h >= p.rows {
                break;
            }
            let mut t0 = 0;
            while t0 < a.n {
                // Monomorphised per tile height so the loops unroll into independent chains:
                // the tallest of 16, 8, 4 that fits, then 3, 2 or 1 rows.
                let left = a.n - t0;
                let tn = [16, 8, 4]
                    .into_iter()
                    .find(|&t| t <= TILE && t <= left)
                    .unwrap_or(left);
                match tn {
                    1 => tile::<D, 1, 1>(p, a, g, h, t0, out, ld),
                    2 => tile::<D, 1, 2>(p, a, g, h, t0, out, ld),
                    3 => tile::<D, 1, 3>(p, a, g, h, t0, out, ld),
                    4 => tile::<D, 1, 4>(p, a, g, h, t0, out, ld),
                    8 => tile::<D, 1, 8>(p, a, g, h, t0, out, ld),
                    _ => tile::<D, 1, 16>(p, a, g, h, t0, out, ld),
                }
                t0 += tn;
            }
        }
    }
}

/// `H` halves (from half `h0`) of group `g` for activation rows `t0..t0 + N`.
#[inline(always)]
unsafe fn tile<D: Dot, const H: usize, const N: usize>(
    p: &Packed,
    a: &QActs,
    g: usize,
    h0: usize,
    t0: usize,
    out: *mut f32,
    ld: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); N]; H];
    macro_rules! tile {
        ($f:ident $(, $c:expr)*) => {
            $f::<D, H, N $(, $c)*>(p, a, g, h0, t0, &mut acc)
        };
    }
    by_format!(p.fmt, tile);
    for (h, rows) in acc.iter().enumerate() {
        for (t, v) in rows.iter().enumerate() {
            store(p, g * GROUP + 8 * (h0 + h), *v, out.add((t0 + t) * ld));
        }
    }
}

/// Stores the 8 outputs of rows `r..r + 8` (those that exist) at `dst + r`.
#[inline(always)]
unsafe fn store(p: &Packed, r: usize, v: __m256, dst: *mut f32) {
    if r >= p.rows {
        return;
    }
    let valid = (p.rows - r).min(8);
    if valid == 8 {
        _mm256_storeu_ps(dst.add(r), v);
    } else {
        let mut tmp = [0f32; 8];
        _mm256_storeu_ps(tmp.as_mut_ptr(), v);
        std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst.add(r), valid);
    }
}

/// Row groups ahead whose weights are prefetched while a group is computed.
const PREFETCH_GROUPS: usize = 1;

/// Prefetches what block `gb` of the row group [`PREFETCH_GROUPS`] ahead needs.
#[inline(always)]
unsafe fn prefetch_block(p: &Packed, gb: usize, nb: usize) {
    let ahead = |ptr: *const u8, bytes: usize| {
        let q = ptr.wrapping_add(PREFETCH_GROUPS * nb * bytes);
        let mut o = 0;
        while o < bytes {
            _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(o) as *const i8);
            o += 64;
        }
    };
    let cb = Packed::chunk_bytes(p.fmt);
    ahead(p.q.as_ptr().add(gb * cb), cb);
    if p.fmt.legacy() {
        ahead(p.d.as_ptr().add(gb * GROUP) as *const u8, 32);
        if p.fmt == Fmt::Q4 {
            ahead(p.m.as_ptr().add(gb * GROUP) as *const u8, 32);
        }
    } else {
        let per = p.fmt.per_block();
        if !p.hb.is_empty() {
            let hbb = p.fmt.hb_bytes();
            ahead(p.hb.as_ptr().add(gb * hbb), hbb);
        }
        ahead(p.isc.as_ptr().add(gb * per * GROUP) as *const u8, 16 * per);
        if !p.imn.is_empty() {
            ahead(p.imn.as_ptr().add(gb * per * GROUP) as *const u8, 16 * per);
        }
    }
}

/// 8 rows' scales (or mins): `v16[at]` (f16, the legacy formats) or, with `S`, the GGML-block
/// value `sup[sup_at]` times the i8 sub-scale `sub[at]` (an exact product).
#[inline(always)]
unsafe fn scale8<const S: bool>(
    v16: &[half::f16],
    sup: &[half::f16],
    sub: &[i8],
    at: usize,
    sup_at: usize,
) -> __m256 {
    if S {
        let s = _mm_loadl_epi64(sub.as_ptr().add(at) as *const __m128i);
        let s = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s));
        _mm256_mul_ps(load_f16x8(sup.as_ptr().add(sup_at)), s)
    } else {
        load_f16x8(v16.as_ptr().add(at))
    }
}

/// 32 bytes of 16 where bit `j` of `bits` is set (byte `j`), 0 elsewhere.
#[inline(always)]
unsafe fn fifth_bits(bits: u32) -> __m256i {
    let v = _mm256_set1_epi32(bits as i32);
    // Byte j takes byte j / 8 of the mask, then tests bit j % 8 of it.
    let idx = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let hit = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, idx), sel), sel);
    _mm256_and_si256(hit, _mm256_set1_epi8(16))
}

#[inline(always)]
unsafe fn load_f16x8(p: *const half::f16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// `H` halves (from half `h0`) × `N` activation rows (from `t0`) of group `g`, nibbles with
/// f16 scales and mins (`Q4`) or sub-scales and sub-mins (`Q4S`).
#[inline(always)]
unsafe fn q4_tile<D: Dot, const H: usize, const N: usize, const S: bool, const FIVE: bool>(
    p: &Packed,
    a: &QActs,
    g: usize,
    h0: usize,
    t0: usize,
    acc: &mut [[__m256; N]; H],
) {
    let nb = p.cols / QK;
    let k = a.k;
    let mask = _mm256_set1_epi8(0x0F);
    for b in 0..nb {
        let gb = g * nb + b;
        let base = p.q.as_ptr().add(gb * 256);
        if t0 == 0 && h0 == 0 {
            prefetch_block(p, gb, nb);
        }
        let mut s = [[D::zero(); N]; H];
        for i in 0..4 {
            for (h, sh) in s.iter_mut().enumerate() {
                let w = _mm256_loadu_si256(base.add(i * 64 + (h0 + h) * 32) as *const __m256i);
                let mut lo = _mm256_and_si256(w, mask);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(w), mask);
                if FIVE {
                    let qh = p.qh.as_ptr().add(gb * 8 + 2 * i);
                    let shift = 32 * (h0 + h);
                    lo = _mm256_or_si256(lo, fifth_bits((*qh >> shift) as u32));
                    hi = _mm256_or_si256(hi, fifth_bits((*qh.add(1) >> shift) as u32));
                }
                for (t, st) in sh.iter_mut().enumerate() {
                    let y = a.qs.as_ptr().add((t0 + t) * k + b * QK);
                    *st = if FIVE {
                        D::q5(*st, lo, hi, y, i)
                    } else {
                        D::q4(*st, lo, hi, y, i)
                    };
                }
            }
        }
        for h in 0..H {
            let at = gb * GROUP + (h0 + h) * 8;
            let sa = p.sup_at(g, b) + (h0 + h) * 8;
            let dw = scale8::<S>(&p.d, &p.sd, &p.isc, at, sa);
            let mw = scale8::<S>(&p.m, &p.sm, &p.imn, at, sa);
            for t in 0..N {
                let row = t0 + t;
                let dx = _mm256_set1_ps(*a.d.get_unchecked(row * nb + b));
                let sx = _mm256_set1_ps(*a.s.get_unchecked(row * nb + b));
                let si = if FIVE {
                    D::q5_rows(s[h][t])
                } else {
                    D::q4_rows(s[h][t])
                };
                let v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_mul_ps(dw, dx), acc[h][t]);
                acc[h][t] = _mm256_fmadd_ps(mw, sx, v);
            }
        }
    }
}

/// Levels with a sub-scale per 16 inputs stored unsigned as level + `OFF` in `W` bits (`Q6S`:
/// nibbles and a plane of two high bits; `Q3S`: two bits four a byte and a plane of third bits;
/// `Q2S`: two bits, `MIN` a min per 16; the layouts of the AVX-512 kernel): each half of
/// a block (the low nibbles, then the high ones) its own integer sum, the offset taken back
/// with the activations' integer half sums; the same sums and epilogue as [`q8_tile`] with
/// halves.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // indices into several arrays at once
unsafe fn q6_tile<
    D: Dot,
    const H: usize,
    const N: usize,
    const W: u32,
    const OFF: i32,
    const MIN: bool,
>(
    p: &Packed,
    a: &QActs,
    g: usize,
    h0: usize,
    t0: usize,
    acc: &mut [[__m256; N]; H],
) {
    let nb = p.cols / QK;
    let k = a.k;
    let mask = _mm256_set1_epi8(0x0F);
    let high = _mm256_set1_epi8(0x30);
    let (cb, hbb) = (Packed::chunk_bytes(p.fmt), p.fmt.hb_bytes());
    for b in 0..nb {
        let gb = g * nb + b;
        let base = p.q.as_ptr().add(gb * cb);
        let hb = p.hb.as_ptr().wrapping_add(gb * hbb);
        if t0 == 0 && h0 == 0 {
            prefetch_block(p, gb, nb);
        }
        // s[0]: the low nibbles (inputs 0..16), s[1]: the high ones (16..32).
        let mut s = [[[D::zero(); N]; H]; 2];
        for h in 0..H {
            let half = (h0 + h) * 32;
            // Levels of chunk i: lo[i] (inputs 4i..), hi[i] (16 + 4i..).
            let mut lo = [_mm256_setzero_si256(); 4];
            let mut hi = [_mm256_setzero_si256(); 4];
            if W <= 3 {
                let three = _mm256_set1_epi8(3);
                for (r, dst) in [&mut lo, &mut hi].into_iter().enumerate() {
                    let w = _mm256_loadu_si256(base.add(r * 64 + half) as *const __m256i);
                    dst[0] = _mm256_and_si256(w, three);
                    dst[1] = _mm256_and_si256(_mm256_srli_epi16::<2>(w), three);
                    dst[2] = _mm256_and_si256(_mm256_srli_epi16::<4>(w), three);
                    dst[3] = _mm256_and_si256(_mm256_srli_epi16::<6>(w), three);
                }
            }
            if W == 3 {
                // Third bits: step s of half r at bit 4r + s, moved to bit 2.
                let x = _mm256_loadu_si256(hb.add(half) as *const __m256i);
                let four = _mm256_set1_epi8(4);
                let bits = [
                    _mm256_slli_epi16::<2>(x),
                    _mm256_slli_epi16::<1>(x),
                    x,
                    _mm256_srli_epi16::<1>(x),
                    _mm256_srli_epi16::<2>(x),
                    _mm256_srli_epi16::<3>(x),
                    _mm256_srli_epi16::<4>(x),
                    _mm256_srli_epi16::<5>(x),
                ];
                for s in 0..4 {
                    lo[s] = _mm256_or_si256(lo[s], _mm256_and_si256(bits[s], four));
                    hi[s] = _mm256_or_si256(hi[s], _mm256_and_si256(bits[4 + s], four));
                }
            }
            for r in 0..(if W == 6 { 2 } else { 0 }) {
                let x = _mm256_loadu_si256(hb.add(r * 64 + half) as *const __m256i);
                let bits = [
                    _mm256_slli_epi16::<4>(x),
                    _mm256_slli_epi16::<2>(x),
                    x,
                    _mm256_srli_epi16::<2>(x),
                ];
                for s in 0..2 {
                    let i = 2 * r + s;
                    let w = _mm256_loadu_si256(base.add(i * 64 + half) as *const __m256i);
                    let wl = _mm256_and_si256(w, mask);
                    let wh = _mm256_and_si256(_mm256_srli_epi16::<4>(w), mask);
                    lo[i] = _mm256_or_si256(wl, _mm256_and_si256(bits[2 * s], high));
                    hi[i] = _mm256_or_si256(wh, _mm256_and_si256(bits[2 * s + 1], high));
                }
            }
            for t in 0..N {
                let y = a.qs.as_ptr().add((t0 + t) * k + b * QK);
                let mut s0 = s[0][h][t];
                let mut s1 = s[1][h][t];
                for i in [0, 2] {
                    s0 = D::q6(s0, lo[i], y.add(4 * i), lo[i + 1], y.add(4 * i + 4));
                    s1 = D::q6(s1, hi[i], y.add(16 + 4 * i), hi[i + 1], y.add(20 + 4 * i));
                }
                s[0][h][t] = s0;
                s[1][h][t] = s1;
            }
        }
        for h in 0..H {
            for part in 0..2 {
                let at = (gb * 2 + part) * GROUP + (h0 + h) * 8;
                let sa = p.sup_at(g, b) + (h0 + h) * 8;
                let dw = scale8::<true>(&p.d, &p.sd, &p.isc, at, sa);
                for t in 0..N {
                    let row = t0 + t;
                    let dx = _mm256_set1_ps(*a.d.get_unchecked(row * nb + b));
                    let hs = (row * nb + b) * 2 + part;
                    let mut si = D::q6_rows(s[part][h][t]);
                    if OFF != 0 {
                        let off = OFF * *a.hs.get_unchecked(hs) as i32;
                        si = _mm256_sub_epi32(si, _mm256_set1_epi32(off));
                    }
                    let mut v =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_mul_ps(dw, dx), acc[h][t]);
                    if MIN {
                        let mw = scale8::<true>(&p.m, &p.sm, &p.imn, at, sa);
                        v = _mm256_fmadd_ps(mw, _mm256_set1_ps(*a.h.get_unchecked(hs)), v);
                    }
                    acc[h][t] = v;
                }
            }
        }
    }
}

/// IQ4 levels (`Q4T`): each nibble indexes the table of 16 int8 levels (a byte shuffle), and
/// the levels then run as int8 weights with a sub-scale per 32 ([`q8_tile`]'s sums and
/// epilogue: chunk i's low nibbles are its step i, the high ones its step 4 + i).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // indices into several arrays at once
unsafe fn q4t_tile<D: Dot, const H: usize, const N: usize>(
    p: &Packed,
    a: &QActs,
    g: usize,
    h0: usize,
    t0: usize,
    acc: &mut [[__m256; N]; H],
) {
    let nb = p.cols / QK;
    let k = a.k;
    let mask = _mm256_set1_epi8(0x0F);
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4_VALUES.as_ptr() as *const __m128i));
    for b in 0..nb {
        let gb = g * nb + b;
        let base = p.q.as_ptr().add(gb * 256);
        if t0 == 0 && h0 == 0 {
            prefetch_block(p, gb, nb);
        }
        let mut s = [[D::zero(); N]; H];
        for h in 0..H {
            for i in 0..4 {
                let w = _mm256_loadu_si256(base.add(i * 64 + (h0 + h) * 32) as *const __m256i);
                let lo = _mm256_shuffle_epi8(table, _mm256_and_si256(w, mask));
                let hi =
                    _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(w), mask));
                for (step, v) in [(i, lo), (4 + i, hi)] {
                    let pv = D::q8_weights(v);
                    for t in 0..N {
                        let o = (t0 + t) * k + b * QK + 4 * step;
                        let st = &mut s[h][t];
                        *st = D::q8(*st, v, pv, a.qs.as_ptr().add(o), a.us.as_ptr().add(o), step);
                    }
                }
            }
        }
        for h in 0..H {
            let at = gb * GROUP + (h0 + h) * 8;
            let sa = p.sup_at(g, b) + (h0 + h) * 8;
            let dw = scale8::<true>(&p.d, &p.sd, &p.isc, at, sa);
            for t in 0..N {
                let dx = _mm256_set1_ps(*a.d.get_unchecked((t0 + t) * nb + b));
                let si = D::q8_rows(s[h][t], p.wsum.as_ptr().add(at));
                acc[h][t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_mul_ps(dw, dx), acc[h][t]);
            }
        }
    }
}

/// As [`q4_tile`] for int8 weights: Q8_0 (f16 scales), or with sub-scales per 32 inputs or per
/// 16 (`HALVES`: each half of a block its own integer sum) and a min term (`MIN`).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // indices into several arrays at once
unsafe fn q8_tile<
    D: Dot,
    const H: usize,
    const N: usize,
    const S: bool,
    const HALVES: bool,
    const MIN: bool,
>(
    p: &Packed,
    a: &QActs,
    g: usize,
    h0: usize,
    t0: usize,
    acc: &mut [[__m256; N]; H],
) {
    let nb = p.cols / QK;
    let k = a.k;
    let per = if HALVES { 2 } else { 1 };
    for b in 0..nb {
        let gb = g * nb + b;
        let base = p.q.as_ptr().add(gb * 512);
        if t0 == 0 && h0 == 0 {
            prefetch_block(p, gb, nb);
        }
        // s[0]: the whole block, or its first 16 inputs with HALVES; s[1]: the last 16.
        let mut s = [[[D::zero(); N]; H]; 2];
        for i in 0..8 {
            let part = if HALVES { i / 4 } else { 0 };
            for h in 0..H {
                let w = _mm256_loadu_si256(base.add(i * 64 + (h0 + h) * 32) as *const __m256i);
                let pw = D::q8_weights(w);
                for t in 0..N {
                    let o = (t0 + t) * k + b * QK + 4 * i;
                    let st = &mut s[part][h][t];
                    *st = D::q8(*st, w, pw, a.qs.as_ptr().add(o), a.us.as_ptr().add(o), i);
                }
            }
        }
        for h in 0..H {
            for part in 0..per {
                let at = (gb * per + part) * GROUP + (h0 + h) * 8;
                let sa = p.sup_at(g, b) + (h0 + h) * 8;
                let dw = scale8::<S>(&p.d, &p.sd, &p.isc, at, sa);
                for t in 0..N {
                    let row = t0 + t;
                    let dx = _mm256_set1_ps(*a.d.get_unchecked(row * nb + b));
                    let si = D::q8_rows(s[part][h][t], p.wsum.as_ptr().add(at));
                    let mut v =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_mul_ps(dw, dx), acc[h][t]);
                    if MIN {
                        let sx = if HALVES {
                            *a.h.get_unchecked((row * nb + b) * 2 + part)
                        } else {
                            *a.s.get_unchecked(row * nb + b)
                        };
                        let mw = scale8::<S>(&p.m, &p.sm, &p.imn, at, sa);
                        v = _mm256_fmadd_ps(mw, _mm256_set1_ps(sx), v);
                    }
                    acc[h][t] = v;
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "avx2_tests.rs"]
mod tests;
