//! AVX2 + FMA inner loops of attention: 8 lanes, a K tile in two registers per dimension.

use super::{AttnElem, Inner, Probs, Records, KV_TILE, QK};
use half::f16;
use std::arch::x86_64::*;

pub struct K;

/// Up to 2 heads at once; a K tile's 16 slots are two 8-lane halves, each with an even-
/// and an odd-dimension chain (8 accumulators, 4 K registers).
#[inline(always)]
unsafe fn scores<const H: usize, E: AttnElem>(
    kt: *const E,
    ks: *const f16,
    q: *const f32,
    hd: usize,
    out: *mut f32,
) {
    let mut even = [[_mm256_setzero_ps(); 2]; H];
    let mut odd = [[_mm256_setzero_ps(); 2]; H];
    let mut scale = [_mm256_setzero_ps(); 2];
    let mut d = 0;
    while d < hd {
        let mut k0 = [
            E::load8(kt.add(d * KV_TILE)),
            E::load8(kt.add(d * KV_TILE + 8)),
        ];
        let mut k1 = [
            E::load8(kt.add((d + 1) * KV_TILE)),
            E::load8(kt.add((d + 1) * KV_TILE + 8)),
        ];
        if E::SCALED {
            if d % QK == 0 {
                for (x, s) in scale.iter_mut().enumerate() {
                    let p = ks.add(d / QK * KV_TILE + 8 * x);
                    *s = _mm256_cvtph_ps(_mm_loadu_si128(p as *const _));
                }
            }
            for x in 0..2 {
                k0[x] = _mm256_mul_ps(k0[x], scale[x]);
                k1[x] = _mm256_mul_ps(k1[x], scale[x]);
            }
        }
        for h in 0..H {
            let q0 = _mm256_set1_ps(*q.add(h * hd + d));
            let q1 = _mm256_set1_ps(*q.add(h * hd + d + 1));
            for x in 0..2 {
                even[h][x] = _mm256_fmadd_ps(q0, k0[x], even[h][x]);
                odd[h][x] = _mm256_fmadd_ps(q1, k1[x], odd[h][x]);
            }
        }
        d += 2;
    }
    for h in 0..H {
        for x in 0..2 {
            let o = out.add(h * KV_TILE + 8 * x);
            _mm256_storeu_ps(o, _mm256_add_ps(even[h][x], odd[h][x]));
        }
    }
}

/// `R` vectors of 8 dimensions of the outputs of `H` heads (head h's probabilities at
/// `p.p + h·p.stride`, its output at `out + h·pw`, which it goes on from when `p.cont`),
/// accumulated over the slots in slot order; each V vector is loaded once for the heads, and a
/// head's chain of FMAs is the same whatever `H`.
#[inline(always)]
unsafe fn vsum<const H: usize, const R: usize, E: AttnElem>(
    p: Probs,
    slots: &[u32],
    (v, vs, d0): (*const E, *const f16, usize),
    hd: usize,
    out: *mut f32,
    pw: usize,
) {
    let nb = E::blocks(hd);
    debug_assert!(d0.is_multiple_of(QK));
    let mut acc = [[_mm256_setzero_ps(); R]; H];
    if p.cont {
        for (h, ah) in acc.iter_mut().enumerate() {
            for (r, a) in ah.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(out.add(h * pw + 8 * r));
            }
        }
    }
    for (i, &slot) in slots.iter().enumerate() {
        let vr = v.add(slot as usize * hd);
        let mut vv = [_mm256_setzero_ps(); R];
        let mut scale = _mm256_setzero_ps();
        for (r, x) in vv.iter_mut().enumerate() {
            *x = E::load8(vr.add(8 * r));
            if E::SCALED {
                // d0 is a multiple of 32: vectors 4j to 4j + 3 share block d0 / 32 + j.
                if r % 4 == 0 {
                    let s = *vs.add(slot as usize * nb + d0 / QK + r / 4);
                    scale = _mm256_cvtph_ps(_mm_set1_epi16(s.to_bits() as i16));
                }
                *x = _mm256_mul_ps(*x, scale);
            }
        }
        for (h, ah) in acc.iter_mut().enumerate() {
            let w = _mm256_set1_ps(*p.p.add(h * p.stride + i));
            for (a, x) in ah.iter_mut().zip(&vv) {
                *a = _mm256_fmadd_ps(w, *x, *a);
            }
        }
    }
    for (h, ah) in acc.iter().enumerate() {
        for (r, a) in ah.iter().enumerate() {
            _mm256_storeu_ps(out.add(h * pw + 8 * r), *a);
        }
    }
}

impl Inner for K {
    #[inline(always)]
    unsafe fn tile_scores<E: AttnElem>(
        kt: &[E],
        ks: &[f16],
        q: &[f32],
        hd: usize,
        out: &mut [f32],
    ) {
        let group = q.len() / hd;
        debug_assert!(kt.len() >= hd * KV_TILE && out.len() >= group * KV_TILE);
        debug_assert!(hd.is_multiple_of(8) && ks.len() == E::blocks(hd) * KV_TILE);
        let (kt, ks, q, o) = (kt.as_ptr(), ks.as_ptr(), q.as_ptr(), out.as_mut_ptr());
        let mut j = 0;
        while j < group {
            let (qj, oj) = (q.add(j * hd), o.add(j * KV_TILE));
            if group - j == 1 {
                scores::<1, E>(kt, ks, qj, hd, oj);
            } else {
                scores::<2, E>(kt, ks, qj, hd, oj);
            }
            j += 2;
        }
    }

    /// Heads in pairs (8 accumulators and 4 V registers of 16).
    #[inline(always)]
    unsafe fn weighted_v<E: AttnElem>(
        p: Probs,
        slots: &[u32],
        (v, vs): (&[E], &[f16]),
        hd: usize,
        r: Records,
    ) {
        let mut j = 0;
        while j < p.heads {
            let two = p.heads - j >= 2;
            let pj = Probs {
                p: p.p.add(j * p.stride),
                ..p
            };
            let mut d = 0;
            while d < hd {
                let o = r.out.add(j * r.pw + 2 + d);
                let vd = (v.as_ptr().add(d), vs.as_ptr(), d);
                macro_rules! rs {
                    ($h:literal) => {
                        match (hd - d) / 8 {
                            1 => vsum::<$h, 1, E>(pj, slots, vd, hd, o, r.pw),
                            2 => vsum::<$h, 2, E>(pj, slots, vd, hd, o, r.pw),
                            3 => vsum::<$h, 3, E>(pj, slots, vd, hd, o, r.pw),
                            _ => vsum::<$h, 4, E>(pj, slots, vd, hd, o, r.pw),
                        }
                    };
                }
                if two {
                    rs!(2)
                } else {
                    rs!(1)
                }
                d += 32;
            }
            j += if two { 2 } else { 1 };
        }
    }
}
