//! Packing f32 operands into the bf16 pairs `vdpbf16ps` reads: rows of pairs for the left
//! operand, 16-lane column blocks for the right one. The scalar loops are the reference; on
//! AVX-512 BF16 the two layouts the training graph reads (row-major, and transposed: rows
//! adjacent in memory) convert 32 values per instruction (`vcvtne2ps2bf16`, nearest even like
//! the scalar rounding). Packing is a few percent of a training step either way, but the
//! scalar strided reads of the backward's transposed operands were most of it.

use super::View;
use crate::runtime::pool;
use crate::runtime::quant::SendPtr;

/// bf16 bits of `x`, rounded to nearest even (NaN stays NaN); branch-free so that packing
/// loops vectorise.
#[inline(always)]
fn bf16_bits(x: f32) -> u32 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    if x.is_nan() {
        0x7fc0
    } else {
        rounded
    }
}

#[inline(always)]
fn pair(lo: f32, hi: f32) -> u32 {
    bf16_bits(lo) | (bf16_bits(hi) << 16)
}

/// Element `p` of a row read with stride `cs` from `base`, 0 past `cols`.
#[inline(always)]
fn get(data: &[f32], base: usize, p: usize, cs: usize, cols: usize) -> f32 {
    if p < cols {
        data[base + p * cs]
    } else {
        0.0
    }
}

/// Row `i`'s pairs into `dst` (`kp2` of them).
fn row_pairs(a: &View, i: usize, dst: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    if a.cs == 1 && super::supported() {
        // SAFETY: the CPU has the features (`supported`); the row lies within `a.data`.
        unsafe { x86::contiguous(&a.data[i * a.rs..i * a.rs + a.cols], dst) };
        return;
    }
    let base = i * a.rs;
    for (q, o) in dst.iter_mut().enumerate() {
        *o = pair(
            get(a.data, base, 2 * q, a.cs, a.cols),
            get(a.data, base, 2 * q + 1, a.cs, a.cols),
        );
    }
}

/// Whether rows `i0..i0 + 16` can be read as 16-lane vectors (rows adjacent in memory).
fn across(v: &View, i0: usize) -> bool {
    cfg!(target_arch = "x86_64") && v.rs == 1 && i0 + 16 <= v.rows && super::supported()
}

/// `a`'s rows as bf16 pairs: row i's pair q (elements 2q, 2q+1; zero past the end) at
/// `i * kp2 + q`, the first element in the low half.
pub(super) fn pack_rows(a: &View, kp2: usize) -> Vec<u32> {
    let mut out = vec![0u32; a.rows * kp2];
    let op = SendPtr(out.as_mut_ptr());
    const BLOCK: usize = 64;
    pool::par_ranges(a.rows.div_ceil(BLOCK), |lo, hi| {
        let (r0, r1) = (lo * BLOCK, (hi * BLOCK).min(a.rows));
        // SAFETY: each range writes only its own rows r0..r1.
        let rows =
            unsafe { std::slice::from_raw_parts_mut(op.get().add(r0 * kp2), (r1 - r0) * kp2) };
        let mut i = r0;
        while i < r1 {
            if i + 16 <= r1 && across(a, i) {
                #[cfg(target_arch = "x86_64")]
                for q in 0..kp2 {
                    let mut lanes = [0u32; 16];
                    // SAFETY: `across` checked the features and that the 16 rows exist.
                    unsafe { x86::lanes(a, i, q, &mut lanes) };
                    for (l, v) in lanes.into_iter().enumerate() {
                        rows[(i - r0 + l) * kp2 + q] = v;
                    }
                }
                i += 16;
            } else {
                row_pairs(a, i, &mut rows[(i - r0) * kp2..(i - r0 + 1) * kp2]);
                i += 1;
            }
        }
    });
    out
}

/// `b`'s rows as columns of 16-lane vectors: column block c's pair q at `(c * kp2 + q) * 16`,
/// lane l holding row `16c + l`'s elements 2q, 2q+1 (zero past the ends).
pub(super) fn pack_cols(b: &View, kp2: usize) -> Vec<u32> {
    let nb = b.rows.div_ceil(16);
    let blk = kp2 * 16;
    let mut out = vec![0u32; nb * blk];
    let op = SendPtr(out.as_mut_ptr());
    pool::par_ranges(nb, |lo, hi| {
        // SAFETY: each range writes only its own column blocks lo..hi.
        let blocks =
            unsafe { std::slice::from_raw_parts_mut(op.get().add(lo * blk), (hi - lo) * blk) };
        let mut rows = vec![0u32; blk];
        for (c, blk) in (lo..hi).zip(blocks.chunks_exact_mut(blk.max(1))) {
            let j0 = c * 16;
            if across(b, j0) {
                #[cfg(target_arch = "x86_64")]
                for (q, lanes) in blk.chunks_exact_mut(16).enumerate() {
                    // SAFETY: `across` checked the features and that the 16 rows exist.
                    unsafe { x86::lanes(b, j0, q, lanes.try_into().expect("16 lanes")) };
                }
                continue;
            }
            // Each row's pairs, then transposed into the block.
            let n = (b.rows - j0).min(16);
            for l in 0..16 {
                let dst = &mut rows[l * kp2..(l + 1) * kp2];
                match l < n {
                    true => row_pairs(b, j0 + l, dst),
                    false => dst.fill(0),
                }
            }
            for (q, lanes) in blk.chunks_exact_mut(16).enumerate() {
                for (l, v) in lanes.iter_mut().enumerate() {
                    *v = rows[l * kp2 + q];
                }
            }
        }
    });
    out
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{get, pair, View};
    use std::arch::x86_64::*;

    /// Consecutive pairs of `src` into `dst`: 32 values per conversion (the bf16 of
    /// `vcvtne2ps2bf16(hi, lo)` in order are exactly the pairs (lo₀, lo₁), (lo₂, lo₃), …).
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub unsafe fn contiguous(src: &[f32], dst: &mut [u32]) {
        let full = src.len() / 32;
        for b in 0..full.min(dst.len() / 16) {
            let lo = _mm512_loadu_ps(src.as_ptr().add(32 * b));
            let hi = _mm512_loadu_ps(src.as_ptr().add(32 * b + 16));
            let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_storeu_si512(dst.as_mut_ptr().add(16 * b) as *mut _, v);
        }
        let cols = src.len();
        for (q, o) in dst.iter_mut().enumerate().skip(16 * full) {
            *o = pair(get(src, 0, 2 * q, 1, cols), get(src, 0, 2 * q + 1, 1, cols));
        }
    }

    /// Pair `q` of rows `i0..i0 + 16` of `v` (rows adjacent in memory: `v.rs == 1`), lane l
    /// holding row `i0 + l`'s.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub unsafe fn lanes(v: &View, i0: usize, q: usize, out: &mut [u32; 16]) {
        let col = |p: usize| {
            if p < v.cols {
                _mm512_loadu_ps(v.data.as_ptr().add(i0 + p * v.cs))
            } else {
                _mm512_setzero_ps()
            }
        };
        let (x, y) = (col(2 * q), col(2 * q + 1));
        // bf16 [x₀ … x₁₅, y₀ … y₁₅], interleaved into (xₗ, yₗ) pairs.
        let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(y, x));
        let idx = _mm512_set_epi16(
            31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20,
            4, 19, 3, 18, 2, 17, 1, 16, 0,
        );
        let p = _mm512_permutexvar_epi16(idx, v);
        _mm512_storeu_si512(out.as_mut_ptr() as *mut _, p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scalar packing every layout must equal.
    fn reference(v: &View, kp2: usize) -> (Vec<u32>, Vec<u32>) {
        let pr = |i: usize, q: usize| {
            let base = i * v.rs;
            pair(
                get(v.data, base, 2 * q, v.cs, v.cols),
                get(v.data, base, 2 * q + 1, v.cs, v.cols),
            )
        };
        let rows = (0..v.rows)
            .flat_map(|i| (0..kp2).map(move |q| (i, q)))
            .map(|(i, q)| pr(i, q))
            .collect();
        let nb = v.rows.div_ceil(16);
        let mut cols = vec![0u32; nb * kp2 * 16];
        for j in 0..v.rows {
            for q in 0..kp2 {
                cols[((j / 16) * kp2 + q) * 16 + j % 16] = pr(j, q);
            }
        }
        (rows, cols)
    }

    /// Row-major and transposed operands of sizes that fill no vector exactly pack
    /// bit-identically to the scalar rounding (values of every magnitude, ties included).
    #[test]
    fn packing_equals_the_scalar_rounding() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut val = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let e = (s >> 50) as i32 % 40 - 20;
            let x = ((s >> 8) as u32 as f32 / u32::MAX as f32 - 0.5) * 2f32.powi(e);
            // Exact ties at bf16 precision now and then.
            if s.is_multiple_of(7) {
                f32::from_bits(x.to_bits() & 0xffff_0000 | 0x8000)
            } else {
                x
            }
        };
        let shapes: [(usize, usize); 6] =
            [(1, 1), (16, 32), (17, 33), (40, 64), (70, 45), (33, 577)];
        for &(rows, cols) in &shapes {
            let data: Vec<f32> = (0..rows * cols).map(|_| val()).collect();
            let kp2 = cols.div_ceil(2);
            for v in [
                View {
                    data: &data,
                    rows,
                    cols,
                    rs: cols,
                    cs: 1,
                },
                View {
                    data: &data,
                    rows,
                    cols,
                    rs: 1,
                    cs: rows,
                },
            ] {
                let (want_rows, want_cols) = reference(&v, kp2);
                assert_eq!(
                    pack_rows(&v, kp2),
                    want_rows,
                    "rows {rows}x{cols} rs {}",
                    v.rs
                );
                assert_eq!(
                    pack_cols(&v, kp2),
                    want_cols,
                    "cols {rows}x{cols} rs {}",
                    v.rs
                );
            }
        }
    }
}
