//! The int8 dot products of the 256-bit kernels ([`super`]): AVX2's `maddubs` and 256-bit
//! VNNI (`vpdpbusd`, VEX or EVEX encoded), behind one trait so that each tile is written once.

use std::arch::x86_64::*;

#[inline(always)]
unsafe fn bcast4(p: *const i8) -> __m256i {
    _mm256_set1_epi32((p as *const i32).read_unaligned())
}

/// The int8 dot products of a kernel family on 8-row registers.
pub(super) trait Dot {
    /// Integer partial sums of one (half, activation row) over a block.
    type Acc: Copy;
    unsafe fn zero() -> Self::Acc;
    /// Q4 partial sums `s` plus step `i` of a block: the low and high nibbles `lo`, `hi` times
    /// the activation bytes `4i..4i+4` and `16+4i..16+4i+4` of `y`.
    unsafe fn q4(s: Self::Acc, lo: __m256i, hi: __m256i, y: *const i8, i: usize) -> Self::Acc;
    /// A block's Q4 partial sums as one i32 per row.
    unsafe fn q4_rows(s: Self::Acc) -> __m256i;
    /// As [`Dot::q4`] for five-bit levels (0..31: 16-bit sums of four steps could overflow).
    unsafe fn q5(s: Self::Acc, lo: __m256i, hi: __m256i, y: *const i8, i: usize) -> Self::Acc;
    /// A block's five-bit partial sums as one i32 per row.
    unsafe fn q5_rows(s: Self::Acc) -> __m256i;
    /// Six-bit partial sums of one half of a block plus two steps: levels (0..63) `wa`, `wb`
    /// times the 4 activation bytes at `ya`, `yb`.
    unsafe fn q6(s: Self::Acc, wa: __m256i, ya: *const i8, wb: __m256i, yb: *const i8)
        -> Self::Acc;
    /// A half's six-bit partial sums as one i32 per row.
    unsafe fn q6_rows(s: Self::Acc) -> __m256i;
    /// A Q8 weight register as the dot products take it (once per tile).
    unsafe fn q8_weights(w: __m256i) -> __m256i;
    /// Q8 partial sums plus step `i`: weights `w` (raw) / `pw` (prepared) times the 4
    /// activation bytes at `y` (signed) / `u` (the same values, unsigned form).
    unsafe fn q8(
        s: Self::Acc,
        w: __m256i,
        pw: __m256i,
        y: *const i8,
        u: *const u8,
        i: usize,
    ) -> Self::Acc;
    /// Q8 sums as one i32 per row, given the 8 rows' weight sums at `wsum`.
    unsafe fn q8_rows(s: Self::Acc, wsum: *const i16) -> __m256i;
}

/// AVX2: `maddubs` then `madd`.
pub(super) struct Maddubs;

impl Dot for Maddubs {
    type Acc = __m256i;
    #[inline(always)]
    unsafe fn zero() -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn q4(s: __m256i, lo: __m256i, hi: __m256i, y: *const i8, i: usize) -> __m256i {
        let pl = _mm256_maddubs_epi16(lo, bcast4(y.add(4 * i)));
        let ph = _mm256_maddubs_epi16(hi, bcast4(y.add(16 + 4 * i)));
        _mm256_add_epi16(s, _mm256_add_epi16(pl, ph))
    }
    #[inline(always)]
    unsafe fn q4_rows(s: __m256i) -> __m256i {
        _mm256_madd_epi16(s, _mm256_set1_epi16(1))
    }
    #[inline(always)]
    unsafe fn q5(s: __m256i, lo: __m256i, hi: __m256i, y: *const i8, i: usize) -> __m256i {
        // One step's four products per 16-bit lane stay below 4·31·127; widen every step.
        let pl = _mm256_maddubs_epi16(lo, bcast4(y.add(4 * i)));
        let ph = _mm256_maddubs_epi16(hi, bcast4(y.add(16 + 4 * i)));
        let p = _mm256_madd_epi16(_mm256_add_epi16(pl, ph), _mm256_set1_epi16(1));
        _mm256_add_epi32(s, p)
    }
    #[inline(always)]
    unsafe fn q5_rows(s: __m256i) -> __m256i {
        s
    }
    #[inline(always)]
    unsafe fn q6(s: __m256i, wa: __m256i, ya: *const i8, wb: __m256i, yb: *const i8) -> __m256i {
        // Two steps' four products per 16-bit lane stay within 4 · 63 · 127 = 32 004.
        let pa = _mm256_maddubs_epi16(wa, bcast4(ya));
        let pb = _mm256_maddubs_epi16(wb, bcast4(yb));
        let p = _mm256_madd_epi16(_mm256_add_epi16(pa, pb), _mm256_set1_epi16(1));
        _mm256_add_epi32(s, p)
    }
    #[inline(always)]
    unsafe fn q6_rows(s: __m256i) -> __m256i {
        s
    }
    #[inline(always)]
    unsafe fn q8_weights(w: __m256i) -> __m256i {
        _mm256_sign_epi8(w, w)
    }
    #[inline(always)]
    unsafe fn q8(
        s: __m256i,
        w: __m256i,
        pw: __m256i,
        y: *const i8,
        _: *const u8,
        _: usize,
    ) -> __m256i {
        let prod = _mm256_maddubs_epi16(pw, _mm256_sign_epi8(bcast4(y), w));
        _mm256_add_epi32(s, _mm256_madd_epi16(prod, _mm256_set1_epi16(1)))
    }
    #[inline(always)]
    unsafe fn q8_rows(s: __m256i, _: *const i16) -> __m256i {
        s
    }
}

/// One `vpdpbusd` on 256-bit registers: `acc + Σ₄ u8 · s8` per i32 lane.
pub(super) trait Dpbusd {
    unsafe fn dp(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

/// AVX-VNNI (VEX encoding).
pub(super) struct Vex;
impl Dpbusd for Vex {
    #[inline(always)]
    unsafe fn dp(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, u, s)
    }
}

/// AVX-512 VNNI + VL (EVEX encoding of the same instruction).
pub(super) struct Evex;
impl Dpbusd for Evex {
    #[inline(always)]
    unsafe fn dp(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }
}

/// 256-bit VNNI, two `vpdpbusd` chains per (half, activation row): one chain would wait on
/// the instruction's latency.
pub(super) struct Vnni<D>(std::marker::PhantomData<D>);

impl<D: Dpbusd> Dot for Vnni<D> {
    type Acc = (__m256i, __m256i);
    #[inline(always)]
    unsafe fn zero() -> Self::Acc {
        (_mm256_setzero_si256(), _mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn q4(s: Self::Acc, lo: __m256i, hi: __m256i, y: *const i8, i: usize) -> Self::Acc {
        (
            D::dp(s.0, lo, bcast4(y.add(4 * i))),
            D::dp(s.1, hi, bcast4(y.add(16 + 4 * i))),
        )
    }
    #[inline(always)]
    unsafe fn q4_rows(s: Self::Acc) -> __m256i {
        _mm256_add_epi32(s.0, s.1)
    }
    #[inline(always)]
    unsafe fn q5(s: Self::Acc, lo: __m256i, hi: __m256i, y: *const i8, i: usize) -> Self::Acc {
        Self::q4(s, lo, hi, y, i)
    }
    #[inline(always)]
    unsafe fn q5_rows(s: Self::Acc) -> __m256i {
        Self::q4_rows(s)
    }
    #[inline(always)]
    unsafe fn q6(
        s: Self::Acc,
        wa: __m256i,
        ya: *const i8,
        wb: __m256i,
        yb: *const i8,
    ) -> Self::Acc {
        (D::dp(s.0, wa, bcast4(ya)), D::dp(s.1, wb, bcast4(yb)))
    }
    #[inline(always)]
    unsafe fn q6_rows(s: Self::Acc) -> __m256i {
        Self::q4_rows(s)
    }
    #[inline(always)]
    unsafe fn q8_weights(w: __m256i) -> __m256i {
        w
    }
    #[inline(always)]
    unsafe fn q8(
        s: Self::Acc,
        w: __m256i,
        _: __m256i,
        _: *const i8,
        u: *const u8,
        i: usize,
    ) -> Self::Acc {
        let x = bcast4(u as *const i8);
        if i.is_multiple_of(2) {
            (D::dp(s.0, x, w), s.1)
        } else {
            (s.0, D::dp(s.1, x, w))
        }
    }
    #[inline(always)]
    unsafe fn q8_rows(s: Self::Acc, wsum: *const i16) -> __m256i {
        let s = _mm256_add_epi32(s.0, s.1);
        let ws = _mm256_cvtepi16_epi32(_mm_loadu_si128(wsum as *const __m128i));
        _mm256_sub_epi32(s, _mm256_slli_epi32::<7>(ws))
    }
}
