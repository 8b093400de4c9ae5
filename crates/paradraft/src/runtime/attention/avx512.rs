//! AVX-512 inner loops of attention: 16 lanes, a K tile in one register per dimension.

use super::{AttnElem, Inner, Probs, Records, KV_TILE, QK};
use half::f16;
use std::arch::x86_64::*;

pub struct K;

/// Up to 4 heads at once: 8 independent FMA chains for 3–4 heads.
#[inline(always)]
unsafe fn scores<const H: usize, E: AttnElem>(
    kt: *const E,
    ks: *const f16,
    q: *const f32,
    hd: usize,
    out: *mut f32,
) {
    let mut even = [_mm512_setzero_ps(); H];
    let mut odd = [_mm512_setzero_ps(); H];
    let mut scale = _mm512_setzero_ps();
    let mut d = 0;
    while d < hd {
        let mut k0 = E::load16(kt.add(d * KV_TILE));
        let mut k1 = E::load16(kt.add((d + 1) * KV_TILE));
        if E::SCALED {
            if d % QK == 0 {
                scale = _mm512_cvtph_ps(_mm256_loadu_si256(ks.add(d / QK * KV_TILE) as *const _));
            }
            k0 = _mm512_mul_ps(k0, scale);
            k1 = _mm512_mul_ps(k1, scale);
        }
        for h in 0..H {
            even[h] = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(h * hd + d)), k0, even[h]);
            odd[h] = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(h * hd + d + 1)), k1, odd[h]);
        }
        d += 2;
    }
    for h in 0..H {
        _mm512_storeu_ps(out.add(h * KV_TILE), _mm512_add_ps(even[h], odd[h]));
    }
}

/// `R` vectors of 16 dimensions of the outputs of `H` heads (head h's probabilities at
/// `p.p + h·p.stride`, its output at `out + h·pw`, which it goes on from when `p.cont`),
/// accumulated over the slots in slot order. Each V vector is loaded (and widened) once for all
/// the heads; every accumulator's chain of FMAs is the same whatever `H`, so a head's output
/// has the same bits alone or with others.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
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
    let mut acc = [[_mm512_setzero_ps(); R]; H];
    if p.cont {
        for (h, ah) in acc.iter_mut().enumerate() {
            for (r, a) in ah.iter_mut().enumerate() {
                *a = _mm512_loadu_ps(out.add(h * pw + 16 * r));
            }
        }
    }
    for (i, &slot) in slots.iter().enumerate() {
        let vr = v.add(slot as usize * hd);
        let mut vv = [_mm512_setzero_ps(); R];
        let mut scale = _mm512_setzero_ps();
        for (r, x) in vv.iter_mut().enumerate() {
            *x = E::load16(vr.add(16 * r));
            if E::SCALED {
                // d0 is a multiple of 32: vectors 2j and 2j + 1 share block d0 / 32 + j.
                if r % 2 == 0 {
                    let s = *vs.add(slot as usize * nb + d0 / QK + r / 2);
                    scale = _mm512_cvtph_ps(_mm256_set1_epi16(s.to_bits() as i16));
                }
                *x = _mm512_mul_ps(*x, scale);
            }
        }
        for (h, ah) in acc.iter_mut().enumerate() {
            let w = _mm512_set1_ps(*p.p.add(h * p.stride + i));
            for (a, x) in ah.iter_mut().zip(&vv) {
                *a = _mm512_fmadd_ps(w, *x, *a);
            }
        }
    }
    for (h, ah) in acc.iter().enumerate() {
        for (r, a) in ah.iter().enumerate() {
            _mm512_storeu_ps(out.add(h * pw + 16 * r), *a);
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
        debug_assert!(ks.len() == E::blocks(hd) * KV_TILE);
        let (kt, ks, q, o) = (kt.as_ptr(), ks.as_ptr(), q.as_ptr(), out.as_mut_ptr());
        let mut j = 0;
        while j < group {
            let (qj, oj) = (q.add(j * hd), o.add(j * KV_TILE));
            match group - j {
                1 => scores::<1, E>(kt, ks, qj, hd, oj),
                2 => scores::<2, E>(kt, ks, qj, hd, oj),
                3 => scores::<3, E>(kt, ks, qj, hd, oj),
                _ => scores::<4, E>(kt, ks, qj, hd, oj),
            }
            j += 4;
        }
    }

    /// Heads in sixes (24 accumulators and 4 V registers of 32): a block of 4 tokens with
    /// SmolLM2's group of 3 widens each V vector twice instead of three times.
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
            let h = (p.heads - j).min(6);
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
                        match (hd - d) / 16 {
                            1 => vsum::<$h, 1, E>(pj, slots, vd, hd, o, r.pw),
                            2 => vsum::<$h, 2, E>(pj, slots, vd, hd, o, r.pw),
                            3 => vsum::<$h, 3, E>(pj, slots, vd, hd, o, r.pw),
                            _ => vsum::<$h, 4, E>(pj, slots, vd, hd, o, r.pw),
                        }
                    };
                }
                match h {
                    1 => rs!(1),
                    2 => rs!(2),
                    3 => rs!(3),
                    4 => rs!(4),
                    5 => rs!(5),
                    _ => rs!(6),
                }
                d += 64;
            }
            j += h;
        }
    }
}
