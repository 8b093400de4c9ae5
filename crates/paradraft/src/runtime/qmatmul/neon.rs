//! AArch64 NEON kernels with the dot-product extension: activation quantization and the
//! `sdot` matmul tiles.
//!
//! A 16-byte slice of a packed chunk (`chunk[i][16q .. 16q + 16]`) holds 4 consecutive weights
//! of each of 4 output rows (4q .. 4q + 4); `sdot` by element multiplies it with one 4-byte
//! group of an activation register and adds each row's 4 products into its 32-bit lane, the
//! same per-row integer sums the x86 kernels form with `dpbusd`. `sdot` is signed × signed, so
//! Q8 weights need no unsigned shift (and no weight-sum correction), and Q4 nibbles (0..15)
//! are already valid signed bytes. Every packed format runs here: the sub-scaled ones (K-quants,
//! Q5_0 / Q5_1, IQ4) scale each row's integer sums by `d · sc` (and add `dmin · m` times the
//! activation sums), the products ggml forms.
//!
//! `sdot` and the f16 → f32 widening (`fcvtl`) go through inline assembly: their intrinsics
//! are not stable Rust.

use super::{BlockOut, Fmt, Packed, QActs, GROUP, QK};
use crate::runtime::blocks::IQ4_VALUES;
use std::arch::aarch64::*;
use std::arch::asm;

/// Activation rows per pass over a row group's weights.
const TILE: usize = 4;

/// `acc += sdot(w, x[lane])`: each 32-bit lane of `acc` gains the dot of its 4 bytes of `w`
/// with bytes `4·lane .. 4·lane + 4` of `x`.
macro_rules! sdot {
    ($acc:expr, $w:expr, $x:expr, $lane:literal) => {
        asm!(
            concat!("sdot {a:v}.4s, {w:v}.16b, {x:v}.4b[", $lane, "]"),
            a = inout(vreg) $acc,
            w = in(vreg) $w,
            x = in(vreg) $x,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
}

/// One 4-row quarter of a group over a 32-input block: `w[i]` holds the 4 rows' weights of
/// inputs 4i.. for i < 4 and 16 + 4(i − 4).. for i ≥ 4, `y` the block's inputs 0..16 and
/// 16..32; each row's lane of `s` gains its 32 products.
#[inline(always)]
unsafe fn dot_block(mut s: int32x4_t, w: &[int8x16_t; 8], y: &[int8x16_t; 2]) -> int32x4_t {
    sdot!(s, w[0], y[0], 0);
    sdot!(s, w[1], y[0], 1);
    sdot!(s, w[2], y[0], 2);
    sdot!(s, w[3], y[0], 3);
    sdot!(s, w[4], y[1], 0);
    sdot!(s, w[5], y[1], 1);
    sdot!(s, w[6], y[1], 2);
    sdot!(s, w[7], y[1], 3);
    s
}

/// Half a block: `w[i]` holds the 4 rows' weights of inputs 4i.. of one 16-input half, `y`
/// that half's inputs.
#[inline(always)]
unsafe fn dot_half(mut s: int32x4_t, w: &[int8x16_t], y: int8x16_t) -> int32x4_t {
    sdot!(s, w[0], y, 0);
    sdot!(s, w[1], y, 1);
    sdot!(s, w[2], y, 2);
    sdot!(s, w[3], y, 3);
    s
}

/// The 16 f16 values at `p` as four f32 vectors.
#[inline(always)]
unsafe fn load_f16x16(p: *const half::f16) -> [float32x4_t; 4] {
    let lo = vld1q_u16(p as *const u16);
    let hi = vld1q_u16((p as *const u16).add(8));
    let mut out = [vdupq_n_f32(0.0); 4];
    for (k, h) in [lo, hi].into_iter().enumerate() {
        let (a, b): (float32x4_t, float32x4_t);
        asm!(
            "fcvtl {a:v}.4s, {h:v}.4h",
            "fcvtl2 {b:v}.4s, {h:v}.8h",
            a = out(vreg) a,
            b = out(vreg) b,
            h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags)
        );
        out[2 * k] = a;
        out[2 * k + 1] = b;
    }
    out
}

/// Per 32-block: scale = amax / 127, round to nearest even, saturate to ±127 (the portable
/// quantization's bits).
#[target_feature(enable = "neon")]
pub(super) unsafe fn quantize(x: &[f32], o: BlockOut) {
    for (bi, xb) in x.chunks_exact(QK).enumerate() {
        let v: [float32x4_t; 8] = std::array::from_fn(|j| vld1q_f32(xb.as_ptr().add(4 * j)));
        let mut m = vabsq_f32(v[0]);
        for vj in &v[1..] {
            m = vmaxq_f32(m, vabsq_f32(*vj));
        }
        let amax = vmaxvq_f32(m);
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        // `fcvtns`: round to nearest, ties to even, as the portable code; |x · id| ≤ 127.
        let q: [int32x4_t; 8] = std::array::from_fn(|j| vcvtnq_s32_f32(vmulq_n_f32(v[j], id)));
        let h: [int16x8_t; 4] =
            std::array::from_fn(|j| vcombine_s16(vqmovn_s32(q[2 * j]), vqmovn_s32(q[2 * j + 1])));
        let b0 = vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1]));
        let b1 = vcombine_s8(vqmovn_s16(h[2]), vqmovn_s16(h[3]));
        vst1q_s8(o.qs.add(bi * QK), b0);
        vst1q_s8(o.qs.add(bi * QK + 16), b1);
        let flip = vdupq_n_u8(0x80);
        vst1q_u8(o.us.add(bi * QK), veorq_u8(vreinterpretq_u8_s8(b0), flip));
        vst1q_u8(
            o.us.add(bi * QK + 16),
            veorq_u8(vreinterpretq_u8_s8(b1), flip),
        );
        let sum = vaddlvq_s16(vaddq_s16(vpaddlq_s8(b0), vpaddlq_s8(b1)));
        *o.d.add(bi) = d;
        *o.s.add(bi) = d * sum as f32;
    }
}

#[target_feature(enable = "neon,dotprod")]
pub unsafe fn matmul_groups(p: &Packed, a: &QActs, g0: usize, g1: usize, out: *mut f32, ld: usize) {
    for g in g0..g1 {
        let mut t0 = 0;
        while t0 < a.n {
            let tn = (a.n - t0).min(TILE);
            let mut acc = [[vdupq_n_f32(0.0); 4]; TILE];
            // Monomorphised per tile height and format, as on x86.
            macro_rules! heights {
                ($f:ident $(, $c:expr)*) => {
                    match tn {
                        1 => $f::<1 $(, $c)*>(p, a, g, t0, &mut acc),
                        2 => $f::<2 $(, $c)*>(p, a, g, t0, &mut acc),
                        3 => $f::<3 $(, $c)*>(p, a, g, t0, &mut acc),
                        _ => $f::<4 $(, $c)*>(p, a, g, t0, &mut acc),
                    }
                };
            }
            by_format!(p.fmt, heights);
            let r0 = g * GROUP;
            let valid = (p.rows - r0).min(GROUP);
            for (t, v) in acc.iter().enumerate().take(tn) {
                let mut tmp = [0f32; GROUP];
                for (q, vq) in v.iter().enumerate() {
                    vst1q_f32(tmp.as_mut_ptr().add(4 * q), *vq);
                }
                let dst = out.add((t0 + t) * ld + r0);
                std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, valid);
            }
            t0 += tn;
        }
    }
}

/// The activation bytes of block `b` of rows `t0 .. t0 + N`: inputs 0..16 and 16..32.
#[inline(always)]
unsafe fn acts<const N: usize>(a: &QActs, t0: usize, b: usize) -> [[int8x16_t; 2]; N] {
    std::array::from_fn(|t| {
        let y = a.qs.as_ptr().add((t0 + t) * a.k + b * QK);
        [vld1q_s8(y), vld1q_s8(y.add(16))]
    })
}

/// 16 rows' `d · sc`: f16 GGML-block scales at `d` times i8 sub-scales at `sc` (exact
/// products), as four 4-row vectors.
#[inline(always)]
unsafe fn sub_scaled(d: *const half::f16, sc: *const i8) -> [float32x4_t; 4] {
    let dv = load_f16x16(d);
    let s = vld1q_s8(sc);
    let (lo, hi) = (vmovl_s8(vget_low_s8(s)), vmovl_s8(vget_high_s8(s)));
    let sv = [
        vmovl_s16(vget_low_s16(lo)),
        vmovl_s16(vget_high_s16(lo)),
        vmovl_s16(vget_low_s16(hi)),
        vmovl_s16(vget_high_s16(hi)),
    ];
    std::array::from_fn(|q| vmulq_f32(dv[q], vcvtq_f32_s32(sv[q])))
}

/// `Q5S`: 16 where the fifth bit of a byte of quarter `q` is set (bit `16q + k` of `mask` for
/// byte `k`: row `4q + k / 4`, input `k % 4` of the chunk), else 0.
#[inline(always)]
unsafe fn fifth_bits(mask: u64, q: usize) -> uint8x16_t {
    const SEL: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let bits = (mask >> (16 * q)) as u16;
    let v = vcombine_u8(vdup_n_u8(bits as u8), vdup_n_u8((bits >> 8) as u8));
    vandq_u8(vtstq_u8(v, vld1q_u8(SEL.as_ptr())), vdupq_n_u8(16))
}

/// Nibble formats: Q4 (Q4_0, Q4_1; an f16 scale and min per 32 inputs), or sub-scaled levels
/// (`S`: Q4_K; `FIVE`: Q5_0, Q5_1, Q5_K with a fifth bit per weight). Per block, for each
/// 4-row quarter q of the group, the low nibbles of `chunk[i]` meet inputs 4i.. and the high
/// ones inputs 16 + 4i..; then `acc += f32(Σ) · d_w · d_x + m_w · s_x`, in that order for every
/// tile height.
#[inline(always)]
unsafe fn q4_tile<const N: usize, const S: bool, const FIVE: bool>(
    p: &Packed,
    a: &QActs,
    g: usize,
    t0: usize,
    acc: &mut [[float32x4_t; 4]; TILE],
) {
    let nb = p.cols / QK;
    let mask = vdupq_n_u8(0x0F);
    for b in 0..nb {
        let gb = g * nb + b;
        let base = p.q.as_ptr().add(gb * 256);
        let y = acts::<N>(a, t0, b);
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
        for q in 0..4 {
            let mut s = [vdupq_n_s32(0); N];
            let w: [uint8x16_t; 4] = std::array::from_fn(|i| vld1q_u8(base.add(i * 64 + q * 16)));
            let mut lo: [uint8x16_t; 4] = std::array::from_fn(|i| vandq_u8(w[i], mask));
            let mut hi: [uint8x16_t; 4] = std::array::from_fn(|i| vshrq_n_u8::<4>(w[i]));
            if FIVE {
                let qh = p.qh.as_ptr().add(gb * 8);
                for i in 0..4 {
                    lo[i] = vorrq_u8(lo[i], fifth_bits(*qh.add(2 * i), q));
                    hi[i] = vorrq_u8(hi[i], fifth_bits(*qh.add(2 * i + 1), q));
                }
            }
            let w: [int8x16_t; 8] =
                std::array::from_fn(|i| vreinterpretq_s8_u8(if i < 4 { lo[i] } else { hi[i - 4] }));
            for t in 0..N {
                s[t] = dot_block(s[t], &w, &y[t]);
            }
            for t in 0..N {
                let row = t0 + t;
                let dx = *a.d.get_unchecked(row * nb + b);
                let sx = *a.s.get_unchecked(row * nb + b);
                let v = vfmaq_f32(acc[t][q], vcvtq_f32_s32(s[t]), vmulq_n_f32(dw[q], dx));
                acc[t][q] = vfmaq_n_f32(v, mw[q], sx);
            }
        }
    }
}

/// Levels with a sub-scale per 16 inputs stored as level + `OFF` in `W` bits (`Q6S`: nibbles and
/// a plane of two high bits; `Q3S`: two bits four a byte and a plane of third bits; `Q2S`: two
/// bits, `MIN` a min per 16; the layouts of the AVX-512 kernel): the signed levels (the
/// offset taken off the bytes) meet each half's activations in its own sum;
/// `acc += f32(Σ₀) · d_w₀ · d_x + f32(Σ₁) · d_w₁ · d_x` (then the min terms), the sums and
/// epilogue of [`q8_tile`] with halves.
#[inline(always)]
unsafe fn q6_tile<const N: usize, const W: u32, const OFF: i32, const MIN: bool>(
    p: &Packed,
    a: &QActs,
    g: usize,
    t0: usize,
    acc: &mut [[float32x4_t; 4]; TILE],
) {
    let nb = p.cols / QK;
    let mask = vdupq_n_u8(0x0F);
    let high = vdupq_n_u8(0x30);
    let off = vdupq_n_u8(OFF as u8);
    let (cb, hbb) = (Packed::chunk_bytes(p.fmt), p.fmt.hb_bytes());
    for b in 0..nb {
        let gb = g * nb + b;
        let base = p.q.as_ptr().add(gb * cb);
        let hb = p.hb.as_ptr().wrapping_add(gb * hbb);
        let y = acts::<N>(a, t0, b);
        let at = gb * 2 * GROUP;
        let sup = p.sup_at(g, b);
        let dw0 = sub_scaled(p.sd.as_ptr().add(sup), p.isc.as_ptr().add(at));
        let dw1 = sub_scaled(p.sd.as_ptr().add(sup), p.isc.as_ptr().add(at + GROUP));
        let (m0, m1) = if MIN {
            (
                sub_scaled(p.sm.as_ptr().add(sup), p.imn.as_ptr().add(at)),
                sub_scaled(p.sm.as_ptr().add(sup), p.imn.as_ptr().add(at + GROUP)),
            )
        } else {
            ([vdupq_n_f32(0.0); 4], [vdupq_n_f32(0.0); 4])
        };
        for q in 0..4 {
            let x: [uint8x16_t; 2] = std::array::from_fn(|r| {
                if W == 6 {
                    vld1q_u8(hb.add(r * 64 + q * 16))
                } else {
                    vdupq_n_u8(0)
                }
            });
            // Bits 4–5 of chunk i's low and high nibbles' levels, from bits 4·(i % 2) and
            // 4·(i % 2) + 2 of register i / 2.
            let bits = |i: usize, hi: bool| {
                let v = x[i / 2];
                let v = match (i % 2, hi) {
                    (0, false) => vshlq_n_u8::<4>(v),
                    (0, true) => vshlq_n_u8::<2>(v),
                    (_, false) => v,
                    (_, true) => vshrq_n_u8::<2>(v),
                };
                vandq_u8(v, high)
            };
            let level = |v: uint8x16_t| vreinterpretq_s8_u8(vsubq_u8(v, off));
            let (lo, hi): ([int8x16_t; 4], [int8x16_t; 4]) = if W <= 3 {
                // Register 0: the first 16 inputs, register 1 the last 16; step s at bits 2s,
                // and (`Q3S`) its third bit at bit 4r + s of the plane.
                let three = vdupq_n_u8(3);
                let four = vdupq_n_u8(4);
                let h = if W == 3 {
                    vld1q_u8(hb.add(q * 16))
                } else {
                    vdupq_n_u8(0)
                };
                let third = [
                    vshlq_n_u8::<2>(h),
                    vshlq_n_u8::<1>(h),
                    h,
                    vshrq_n_u8::<1>(h),
                    vshrq_n_u8::<2>(h),
                    vshrq_n_u8::<3>(h),
                    vshrq_n_u8::<4>(h),
                    vshrq_n_u8::<5>(h),
                ]
                .map(|v| vandq_u8(v, four));
                let two = |r: usize| {
                    let w = vld1q_u8(base.add(r * 64 + q * 16));
                    let v = [
                        w,
                        vshrq_n_u8::<2>(w),
                        vshrq_n_u8::<4>(w),
                        vshrq_n_u8::<6>(w),
                    ];
                    std::array::from_fn(|s| {
                        level(vorrq_u8(vandq_u8(v[s], three), third[4 * r + s]))
                    })
                };
                (two(0), two(1))
            } else {
                let w: [uint8x16_t; 4] =
                    std::array::from_fn(|i| vld1q_u8(base.add(i * 64 + q * 16)));
                (
                    std::array::from_fn(|i| level(vorrq_u8(vandq_u8(w[i], mask), bits(i, false)))),
                    std::array::from_fn(|i| level(vorrq_u8(vshrq_n_u8::<4>(w[i]), bits(i, true)))),
                )
            };
            let mut s0 = [vdupq_n_s32(0); N];
            let mut s1 = [vdupq_n_s32(0); N];
            for t in 0..N {
                s0[t] = dot_half(s0[t], &lo, y[t][0]);
                s1[t] = dot_half(s1[t], &hi, y[t][1]);
            }
            for t in 0..N {
                let row = t0 + t;
                let dx = *a.d.get_unchecked(row * nb + b);
                let v = vfmaq_f32(acc[t][q], vcvtq_f32_s32(s0[t]), vmulq_n_f32(dw0[q], dx));
                let mut v = vfmaq_f32(v, vcvtq_f32_s32(s1[t]), vmulq_n_f32(dw1[q], dx));
                if MIN {
                    let h = (row * nb + b) * 2;
                    v = vfmaq_n_f32(v, m0[q], *a.h.get_unchecked(h));
                    v = vfmaq_n_f32(v, m1[q], *a.h.get_unchecked(h + 1));
                }
                acc[t][q] = v;
            }
        }
    }
}

/// IQ4 levels (`Q4T`): each nibble indexes the table of 16 int8 levels (`tbl`), then signed ×
/// signed as [`q8_tile`] with a sub-scale per 32 (its sums and epilogue).
#[inline(always)]
unsafe fn q4t_tile<const N: usize>(
    p: &Packed,
    a: &QActs,
    g: usize,
    t0: usize,
    acc: &mut [[float32x4_t; 4]; TILE],
) {
    let nb = p.cols / QK;
    let mask = vdupq_n_u8(0x0F);
    let table = vld1q_s8(IQ4_VALUES.as_ptr());
    for b in 0..nb {
        let gb = g * nb + b;
        let base = p.q.as_ptr().add(gb * 256);
        let y = acts::<N>(a, t0, b);
        let dw = sub_scaled(
            p.sd.as_ptr().add(p.sup_at(g, b)),
            p.isc.as_ptr().add(gb * GROUP),
        );
        for q in 0..4 {
            let raw: [uint8x16_t; 4] = std::array::from_fn(|i| vld1q_u8(base.add(i * 64 + q * 16)));
            let w: [int8x16_t; 8] = std::array::from_fn(|i| {
                let idx = if i < 4 {
                    vandq_u8(raw[i], mask)
                } else {
                    vshrq_n_u8::<4>(raw[i - 4])
                };
                vqtbl1q_s8(table, idx)
            });
            let mut s = [vdupq_n_s32(0); N];
            for t in 0..N {
                s[t] = dot_block(s[t], &w, &y[t]);
            }
            for t in 0..N {
                let dx = *a.d.get_unchecked((t0 + t) * nb + b);
                acc[t][q] = vfmaq_f32(acc[t][q], vcvtq_f32_s32(s[t]), vmulq_n_f32(dw[q], dx));
            }
        }
    }
}

/// Int8 weights: Q8_0 (an f16 scale per 32 inputs), or levels with sub-scales (`S`) per 32
/// inputs or per 16 (`HALVES`: each half of the block its own integer sum and scale) and a min
/// term (`MIN`). `chunk[i]` meets inputs 4i.. (i < 4) and 16 + 4(i − 4).. (i ≥ 4), signed ×
/// signed (no weight sums needed); `acc += f32(Σ) · d_w · d_x` (per half), then the min term,
/// in that order for every tile height.
#[inline(always)]
unsafe fn q8_tile<const N: usize, const S: bool, const HALVES: bool, const MIN: bool>(
    p: &Packed,
    a: &QActs,
    g: usize,
    t0: usize,
    acc: &mut [[float32x4_t; 4]; TILE],
) {
    let nb = p.cols / QK;
    let per = if HALVES { 2 } else { 1 };
    let zero = [vdupq_n_f32(0.0); 4];
    for b in 0..nb {
        let gb = g * nb + b;
        let base = p.q.as_ptr().add(gb * 512);
        let y = acts::<N>(a, t0, b);
        let at = gb * per * GROUP;
        let sup = p.sup_at(g, b);
        let dw0 = if S {
            sub_scaled(p.sd.as_ptr().add(sup), p.isc.as_ptr().add(at))
        } else {
            load_f16x16(p.d.as_ptr().add(gb * GROUP))
        };
        let dw1 = if HALVES {
            sub_scaled(p.sd.as_ptr().add(sup), p.isc.as_ptr().add(at + GROUP))
        } else {
            zero
        };
        let (m0, m1) = if MIN {
            (
                sub_scaled(p.sm.as_ptr().add(sup), p.imn.as_ptr().add(at)),
                if HALVES {
                    sub_scaled(p.sm.as_ptr().add(sup), p.imn.as_ptr().add(at + GROUP))
                } else {
                    zero
                },
            )
        } else {
            (zero, zero)
        };
        for q in 0..4 {
            let w: [int8x16_t; 8] =
                std::array::from_fn(|i| vld1q_s8(base.add(i * 64 + q * 16) as _));
            let mut s0 = [vdupq_n_s32(0); N];
            let mut s1 = [vdupq_n_s32(0); N];
            for t in 0..N {
                if HALVES {
                    s0[t] = dot_half(s0[t], &w[..4], y[t][0]);
                    s1[t] = dot_half(s1[t], &w[4..], y[t][1]);
                } else {
                    s0[t] = dot_block(s0[t], &w, &y[t]);
                }
            }
            for t in 0..N {
                let row = t0 + t;
                let dx = *a.d.get_unchecked(row * nb + b);
                let mut v = vfmaq_f32(acc[t][q], vcvtq_f32_s32(s0[t]), vmulq_n_f32(dw0[q], dx));
                if HALVES {
                    v = vfmaq_f32(v, vcvtq_f32_s32(s1[t]), vmulq_n_f32(dw1[q], dx));
                    if MIN {
                        let h = (row * nb + b) * 2;
                        v = vfmaq_n_f32(v, m0[q], *a.h.get_unchecked(h));
                        v = vfmaq_n_f32(v, m1[q], *a.h.get_unchecked(h + 1));
                    }
                } else if MIN {
                    v = vfmaq_n_f32(v, m0[q], *a.s.get_unchecked(row * nb + b));
                }
                acc[t][q] = v;
            }
        }
    }
}
