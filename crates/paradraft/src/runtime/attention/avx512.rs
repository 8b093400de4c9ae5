//! AVX-512 inner loops of attention: 16 lanes, a K tile in one register per dimension.

use super::{AttnElem, Inner, Records, KV_TILE};
use std::arch::x86_64::*;

pub struct K;

/// Up to 4 heads at once: 8 independent FMA chains for 3–4 heads.
#[inline(always)]
unsafe fn scores<const H: usize, E: AttnElem>(
    kt: *const E,
    q: *const f32,
    hd: usize,
    out: *mut f32,
) {
    let mut even = [_mm512_setzero_ps(); H];
    let mut odd = [_mm512_setzero_ps(); H];
    let mut d = 0;
    while d < hd {
        let k0 = E::load16(kt.add(d * KV_TILE));
        let k1 = E::load16(kt.add((d + 1) * KV_TILE));
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

/// `R` vectors of 16 dimensions of one head's output, accumulated over the slots.
#[inline(always)]
unsafe fn vsum<const R: usize, E: AttnElem>(
    p: *const f32,
    slots: &[u32],
    v: *const E,
    hd: usize,
    out: *mut f32,
) {
    let mut acc = [_mm512_setzero_ps(); R];
    for (i, &slot) in slots.iter().enumerate() {
        let w = _mm512_set1_ps(*p.add(i));
        let vr = v.add(slot as usize * hd);
        for (r, a) in acc.iter_mut().enumerate() {
            *a = _mm512_fmadd_ps(w, E::load16(vr.add(16 * r)), *a);
        }
    }
    for (r, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(out.add(16 * r), *a);
    }
}

impl Inner for K {
    #[inline(always)]
    unsafe fn tile_scores<E: AttnElem>(kt: &[E], q: &[f32], hd: usize, out: &mut [f32]) {
        let group = q.len() / hd;
        debug_assert!(kt.len() >= hd * KV_TILE && out.len() >= group * KV_TILE);
        let (kt, q, o) = (kt.as_ptr(), q.as_ptr(), out.as_mut_ptr());
        let mut j = 0;
        while j < group {
            let (qj, oj) = (q.add(j * hd), o.add(j * KV_TILE));
            match group - j {
                1 => scores::<1, E>(kt, qj, hd, oj),
                2 => scores::<2, E>(kt, qj, hd, oj),
                3 => scores::<3, E>(kt, qj, hd, oj),
                _ => scores::<4, E>(kt, qj, hd, oj),
            }
            j += 4;
        }
    }

    #[inline(always)]
    unsafe fn weighted_v<E: AttnElem>(p: &[f32], slots: &[u32], v: &[E], hd: usize, r: Records) {
        let len = slots.len();
        for j in 0..p.len() / len.max(1) {
            let pj = p.as_ptr().add(j * len);
            let mut d = 0;
            while d < hd {
                let o = r.out.add(j * r.pw + 2 + d);
                let vd = v.as_ptr().add(d);
                match (hd - d) / 16 {
                    1 => vsum::<1, E>(pj, slots, vd, hd, o),
                    2 => vsum::<2, E>(pj, slots, vd, hd, o),
                    3 => vsum::<3, E>(pj, slots, vd, hd, o),
                    _ => vsum::<4, E>(pj, slots, vd, hd, o),
                }
                d += 64;
            }
        }
    }
}
