//! AVX2 + FMA kernels (`maddubs`/`madd`; sign trick for Q8 weights).

use super::{GgmlType, Packed, QActs, GROUP, QK};
use std::arch::x86_64::*;

/// AVX2 without VNNI: 8 rows per 256-bit register; `maddubs` (u8·s8 → i16 pairs) then
/// `madd` with ones (→ i32). For Q8 weights the sign trick keeps `maddubs` from saturating:
/// |w| · sign(y, w).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn matmul_groups(p: &Packed, a: &QActs, g0: usize, g1: usize, out: *mut f32, ld: usize) {
    let nb = p.cols / QK;
    let ones = _mm256_set1_epi16(1);
    let mask = _mm256_set1_epi8(0x0F);
    for g in g0..g1 {
        for half in 0..2 {
            let r0 = g * GROUP + half * 8;
            if r0 >= p.rows {
                break;
            }
            for t in 0..a.n {
                let mut acc = _mm256_setzero_ps();
                for b in 0..nb {
                    let gb = g * nb + b;
                    let dw = _mm256_cvtph_ps(_mm_loadu_si128(
                        p.d.as_ptr().add(gb * GROUP + half * 8) as *const __m128i,
                    ));
                    let dx = _mm256_set1_ps(*a.d.get_unchecked(t * nb + b));
                    let y = a.qs.as_ptr().add(t * a.k + b * QK);
                    let bc =
                        |o: usize| _mm256_set1_epi32((y.add(o) as *const i32).read_unaligned());
                    let mut s = _mm256_setzero_si256();
                    if p.ty == GgmlType::Q8_0 {
                        let base = p.q.as_ptr().add(gb * 512 + half * 32);
                        for i in 0..8 {
                            let w = _mm256_loadu_si256(base.add(i * 64) as *const __m256i);
                            let yy = bc(4 * i);
                            let prod = _mm256_maddubs_epi16(
                                _mm256_sign_epi8(w, w),
                                _mm256_sign_epi8(yy, w),
                            );
                            s = _mm256_add_epi32(s, _mm256_madd_epi16(prod, ones));
                        }
                        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, dx), acc);
                    } else {
                        let base = p.q.as_ptr().add(gb * 256 + half * 32);
                        for i in 0..4 {
                            let w = _mm256_loadu_si256(base.add(i * 64) as *const __m256i);
                            let lo = _mm256_and_si256(w, mask);
                            let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), mask);
                            let pl = _mm256_maddubs_epi16(lo, bc(4 * i));
                            let ph = _mm256_maddubs_epi16(hi, bc(16 + 4 * i));
                            s = _mm256_add_epi32(
                                s,
                                _mm256_madd_epi16(_mm256_add_epi16(pl, ph), ones),
                            );
                        }
                        let mw = _mm256_cvtph_ps(_mm_loadu_si128(
                            p.m.as_ptr().add(gb * GROUP + half * 8) as *const __m128i,
                        ));
                        let sx = _mm256_set1_ps(*a.s.get_unchecked(t * nb + b));
                        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, dx), acc);
                        acc = _mm256_fmadd_ps(mw, sx, acc);
                    }
                }
                let valid = (p.rows - r0).min(8);
                let mut tmp = [0f32; 8];
                _mm256_storeu_ps(tmp.as_mut_ptr(), acc);
                std::ptr::copy_nonoverlapping(tmp.as_ptr(), out.add(t * ld + r0), valid);
            }
        }
    }
}
