//! GGML tensor types: block layouts and dequantisation of F32, F16, BF16, Q4_0, Q4_1 and Q8_0
//! here (the other quantized types in [`super::blocks`]), and the weight matrix type with its
//! matmul.
//!
//! Block layouts (little-endian, as in GGML):
//! - Q4_0: `d: f16, qs: [u8; 16]` — x[j] = (lo(qs[j]) − 8)·d, x[j+16] = (hi(qs[j]) − 8)·d
//! - Q4_1: `d: f16, m: f16, qs: [u8; 16]` — x[j] = lo(qs[j])·d + m, x[j+16] = hi(qs[j])·d + m
//! - Q8_0: `d: f16, qs: [i8; 32]` — x[j] = qs[j]·d

pub use super::ggml::{GgmlType, QK};
use super::kquantize::signed_amax;
pub(crate) use super::pool::SendPtr;
pub use super::pool::{par_ranges, PAR_ROWS};
use super::qmatmul::{Packed, QActs};
use half::{bf16, f16};

/// Quantises f32 values (a multiple of 32) to GGML Q8_0 blocks: per 32 values an f16 scale
/// d = max|x| / 127 and round(x / d) as i8 (llama.cpp's reference quantiser).
pub fn quantize_q8_0(x: &[f32]) -> Vec<u8> {
    assert!(x.len().is_multiple_of(QK), "Q8_0 needs whole blocks of 32");
    let mut out = Vec::with_capacity(x.len() / QK * 34);
    let mut q = [0i8; QK];
    for b in x.chunks_exact(QK) {
        out.extend_from_slice(&q8_0_block(b, &mut q).to_le_bytes());
        out.extend(q.iter().map(|&v| v as u8));
    }
    out
}

/// One Q8_0 block of up to 32 values (llama.cpp's reference rule): returns the scale
/// d = max|x| / 127 as f16 and writes round(x · (1 / d)) into `q`.
pub(crate) fn q8_0_block(x: &[f32], q: &mut [i8]) -> f16 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = round_i8(v * id);
    }
    f16::from_f32(d)
}

/// `x.round() as i8` (half away from zero, saturating, NaN to 0) without the `roundf` call
/// `f32::round` is on x86-64: from 0.5 on, `|x| + 0.5` is exact below 2²³ (0.5 is a multiple
/// of |x|'s last place) and truncates to the rounded magnitude; below 0.5 (and NaN) it is 0.
#[inline(always)]
fn round_i8(x: f32) -> i8 {
    let a = x.abs();
    let m = if a >= 0.5 { (a + 0.5) as i32 } else { 0 };
    let r = if x < 0.0 { -m } else { m };
    r.clamp(-128, 127) as i8
}

/// Quantises f32 values (a multiple of 32) to GGML Q4_0 blocks as llama.cpp's reference
/// quantiser does: per 32 values the one of largest magnitude m, an f16 scale d = m / −8, and
/// min(15, trunc(x / d + 8.5)) as 4 bits (low nibbles hold inputs 0..16).
pub fn quantize_q4_0(x: &[f32]) -> Vec<u8> {
    assert!(x.len().is_multiple_of(QK), "Q4_0 needs whole blocks of 32");
    let mut out = Vec::with_capacity(x.len() / QK * 18);
    for b in x.chunks_exact(QK) {
        let m = signed_amax(b);
        let d = m / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        out.extend((0..16).map(|j| q(b[j]) | (q(b[j + 16]) << 4)));
    }
    out
}

/// Quantises f32 values (a multiple of 32) to GGML Q4_1 blocks: per 32 values f16 `d =
/// (max − min) / 15` and `m = min`, and the nearest level `round((x − m) / d)` in 0..=15,
/// computed with the stored (f16) `d` and `m` so that dequantisation lands within half a step
/// (low nibbles hold inputs 0..16).
pub fn quantize_q4_1(x: &[f32]) -> Vec<u8> {
    assert!(x.len().is_multiple_of(QK), "Q4_1 needs whole blocks of 32");
    let mut out = vec![0u8; x.len() / QK * 20];
    quantize_q4_1_into(x, &mut out);
    out
}

/// [`quantize_q4_1`] into `out` (20 bytes per block of `x`), written block by block into
/// fixed arrays so that the levels are computed 16 lanes at a time.
pub fn quantize_q4_1_into(x: &[f32], out: &mut [u8]) {
    assert!(x.len().is_multiple_of(QK), "Q4_1 needs whole blocks of 32");
    assert_eq!(out.len(), x.len() / QK * 20);
    for (b, o) in x.chunks_exact(QK).zip(out.chunks_exact_mut(20)) {
        let (min, max) = min_max(b);
        let (d, m) = (f16::from_f32((max - min) / 15.0), f16::from_f32(min));
        o[..2].copy_from_slice(&d.to_le_bytes());
        o[2..4].copy_from_slice(&m.to_le_bytes());
        let (d, m) = (d.to_f32(), m.to_f32());
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let (lo, hi) = b.split_at(QK / 2);
        for ((q, &l), &h) in o[4..].iter_mut().zip(lo).zip(hi) {
            *q = nibble((l - m) * id) | (nibble((h - m) * id) << 4);
        }
    }
}

/// `b`'s least and greatest values as folds of `f32::min` / `f32::max` in order find them
/// (NaNs ignored; ±∞ when all are NaN), computed in 8 independent lanes. Values that compare
/// equal have the same bits unless they are zeros, whose sign the fold's order decides: a zero
/// extreme is found again by the ordered fold.
#[inline(always)]
fn min_max(b: &[f32]) -> (f32, f32) {
    let (mut lo, mut hi) = ([f32::INFINITY; 8], [f32::NEG_INFINITY; 8]);
    for c in b.chunks_exact(8) {
        for k in 0..8 {
            lo[k] = lo[k].min(c[k]);
            hi[k] = hi[k].max(c[k]);
        }
    }
    let mut min = lo.iter().copied().fold(f32::INFINITY, f32::min);
    let mut max = hi.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if min == 0.0 {
        min = b.iter().copied().fold(f32::INFINITY, f32::min);
    }
    if max == 0.0 {
        max = b.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    }
    (min, max)
}

/// `x.round().clamp(0.0, 15.0) as u8` without the `roundf` call `f32::round` is on x86-64
/// (a third of building SmolLM2's output screen at load): below 0.5 (and NaN) it is 0; from
/// 0.5 to 15 `x + 0.5` is exact (both are multiples of x's last place) and truncates to the
/// rounded value; from 15 on it is 15.
#[inline(always)]
fn nibble(x: f32) -> u8 {
    if x >= 15.0 {
        15
    } else if x >= 0.5 {
        (x + 0.5) as u8
    } else {
        0 // NaN too
    }
}

/// Dequantises `src` (a whole number of blocks of `ty`) into `dst`.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    debug_assert_eq!(ty.row_bytes(dst.len()), src.len());
    match ty {
        GgmlType::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            // In runs of 256 through `half`'s slice conversion (F16C eight at a time where
            // the CPU has it; exact either way): one call per value was most of converting a
            // DART drafter's 10 M f16 weights at load.
            use half::slice::HalfFloatSliceExt;
            let mut run = [f16::ZERO; 256];
            for (d, s) in dst.chunks_mut(256).zip(src.chunks(512)) {
                let n = d.len().min(s.len() / 2);
                for (h, c) in run[..n].iter_mut().zip(s.chunks_exact(2)) {
                    *h = f16::from_le_bytes([c[0], c[1]]);
                }
                run[..n].convert_to_f32_slice(&mut d[..n]);
            }
        }
        GgmlType::BF16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        // Every block type through one unpacker (checked bit for bit against ggml's).
        _ => super::blocks::dequantize_blocks(ty, src, dst),
    }
}

/// A 2-D weight `[rows, cols]` (row-major: one output feature per row) in any supported type.
/// Dense types are widened to f32 at load; quantized types keep their GGML blocks.
#[derive(Clone)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    data: MatrixData,
}

#[derive(Clone)]
enum MatrixData {
    F32(Vec<f32>),
    Quant(Box<Packed>),
}

impl Matrix {
    /// Builds a matrix from raw GGML bytes. Dense types are widened to f32.
    pub fn from_bytes(ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Self {
        assert_eq!(bytes.len(), rows * ty.row_bytes(cols));
        let data = match ty {
            _ if ty.is_dense() => {
                let mut v = vec![0f32; rows * cols];
                dequantize(ty, bytes, &mut v);
                MatrixData::F32(v)
            }
            _ => MatrixData::Quant(Box::new(Packed::new(ty, rows, cols, bytes))),
        };
        Matrix { rows, cols, data }
    }

    pub fn from_f32(rows: usize, cols: usize, v: Vec<f32>) -> Self {
        assert_eq!(v.len(), rows * cols);
        Matrix {
            rows,
            cols,
            data: MatrixData::F32(v),
        }
    }

    pub fn ty(&self) -> GgmlType {
        match &self.data {
            MatrixData::F32(_) => GgmlType::F32,
            MatrixData::Quant(p) => p.ty,
        }
    }

    /// Bytes of weight data (what one full matmul streams from memory).
    pub fn nbytes(&self) -> usize {
        match &self.data {
            MatrixData::F32(v) => v.len() * 4,
            MatrixData::Quant(p) => p.nbytes(),
        }
    }

    /// Writes row `r` as f32 into `dst` (length `cols`).
    pub fn row_into(&self, r: usize, dst: &mut [f32]) {
        match &self.data {
            MatrixData::F32(v) => dst.copy_from_slice(&v[r * self.cols..(r + 1) * self.cols]),
            MatrixData::Quant(p) => p.row_into(r, dst),
        }
    }

    /// This matrix in Q8_0 (for dense weights whose columns are a multiple of 32); already
    /// quantized matrices and other widths are returned unchanged.
    pub fn to_q8_0(self) -> Matrix {
        self.quantized(GgmlType::Q8_0)
    }

    /// This matrix in `ty` (Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1 by llama.cpp's reference
    /// quantisers, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL or IQ4_XS by [`super::kquantize`]) when
    /// it is dense and its columns are a multiple of 32; otherwise unchanged. A 256-block type
    /// whose rows are not whole 256-blocks falls back as llama-quantize's (0.3.36's) does: Q2_K
    /// and Q3_K to Q4_0, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, IQ4_XS to IQ4_NL.
    pub fn quantized(self, ty: GgmlType) -> Matrix {
        let Some((ty, quantize)) = quantiser(ty, self.cols) else {
            return self;
        };
        match &self.data {
            MatrixData::F32(v) if self.cols.is_multiple_of(QK) => {
                // Rows are quantized independently, so in parallel (a 1.7 B model's K-quant
                // search is minutes on one core).
                let (cols, rb) = (self.cols, ty.row_bytes(self.cols));
                let mut bytes = vec![0u8; self.rows * rb];
                let out = SendPtr(bytes.as_mut_ptr());
                par_ranges(self.rows, |r0, r1| {
                    let q = quantize(&v[r0 * cols..r1 * cols]);
                    debug_assert_eq!(q.len(), (r1 - r0) * rb);
                    // SAFETY: the task of rows r0..r1 alone writes their bytes.
                    unsafe {
                        std::ptr::copy_nonoverlapping(q.as_ptr(), out.get().add(r0 * rb), q.len())
                    }
                });
                Matrix::from_bytes(ty, self.rows, self.cols, &bytes)
            }
            _ => self,
        }
    }

    /// [`Matrix::to_q8_0`] in place.
    pub fn quantize_q8_0(&mut self) {
        self.quantize(GgmlType::Q8_0);
    }

    /// [`Matrix::quantized`] in place.
    pub fn quantize(&mut self, ty: GgmlType) {
        *self = std::mem::replace(self, Matrix::from_f32(0, 0, vec![])).quantized(ty);
    }

    /// The given rows, in that order, in the same type (bit-exact).
    pub fn select_rows(&self, rows: &[usize]) -> Matrix {
        let data = match &self.data {
            MatrixData::F32(v) => MatrixData::F32(
                rows.iter()
                    .flat_map(|&r| v[r * self.cols..(r + 1) * self.cols].iter().copied())
                    .collect(),
            ),
            MatrixData::Quant(p) => MatrixData::Quant(Box::new(p.select_rows(rows))),
        };
        Matrix {
            rows: rows.len(),
            cols: self.cols,
            data,
        }
    }

    /// Whether its int8 kernel reads the activations' sums per 16 inputs ([`QActs::halves`]).
    pub fn reads_half_sums(&self) -> bool {
        matches!(&self.data, MatrixData::Quant(p) if p.fmt.half_sums())
    }

    /// Whether [`Matrix::matmul`] wants int8 activations ([`QActs`]) rather than f32.
    pub fn wants_qacts(&self) -> bool {
        matches!(self.data, MatrixData::Quant(_))
    }

    /// `out[t, r] = Σ_i self[r, i] · x[t, i]` for `n = x.len() / cols` activation rows.
    /// A quantized matrix uses int8 activations when `qa` holds `x` quantized (see
    /// [`QActs::quantize`]); with an empty `qa` it multiplies the dequantised weights with the f32
    /// activations (the exact reference path).
    pub fn matmul(&self, x: &[f32], qa: &QActs, out: &mut [f32]) {
        let (k, m) = (self.cols, self.rows);
        let n = x.len() / k;
        assert_eq!(x.len(), n * k);
        assert_eq!(out.len(), n * m);
        let out_ptr = SendPtr(out.as_mut_ptr());
        match &self.data {
            MatrixData::Quant(p) if qa.n == 0 => {
                par_ranges(m.div_ceil(16), |c0, c1| {
                    let o = &out_ptr;
                    let mut w = vec![0f32; k];
                    for r in c0 * 16..(c1 * 16).min(m) {
                        p.row_into(r, &mut w);
                        for t in 0..n {
                            // SAFETY: each (t, r) is written by exactly one task.
                            unsafe { *o.0.add(t * m + r) = dot(&w, &x[t * k..(t + 1) * k]) };
                        }
                    }
                });
            }
            MatrixData::Quant(_) => {
                assert!(
                    qa.n == n && qa.k == k,
                    "activations not quantized for this matmul"
                );
                self.matmul_qacts(qa, out);
            }
            MatrixData::F32(v) => {
                par_ranges(m.div_ceil(16), |c0, c1| {
                    let o = &out_ptr;
                    // Each task writes only the output columns of its own rows.
                    dense_rows(v, x, k, m, c0 * 16, (c1 * 16).min(m), o.0 as usize);
                });
            }
        }
    }

    /// Row `r` times `x` with f32 activations (exact up to f32 rounding); `tmp` holds `cols`.
    pub fn row_dot(&self, r: usize, x: &[f32], tmp: &mut [f32]) -> f32 {
        self.row_into(r, tmp);
        dot(tmp, x)
    }

    /// `out[t, r] = Σ_i self[r, i] · x_t[i]` for the rows of `qa` (a quantized matrix only).
    pub fn matmul_qacts(&self, qa: &QActs, out: &mut [f32]) {
        let MatrixData::Quant(p) = &self.data else {
            panic!("matmul_qacts needs a quantized matrix");
        };
        let m = self.rows;
        assert!(qa.k == self.cols && out.len() == qa.n * m);
        assert_halves(p, qa);
        let out_ptr = SendPtr(out.as_mut_ptr());
        par_ranges(p.groups(), |g0, g1| {
            let o = &out_ptr;
            // SAFETY: each task writes only the rows of its own groups.
            unsafe { p.matmul_groups(qa, g0, g1, o.0, m) };
        });
    }

    /// Several matmuls of the same input in one parallel region (q/k/v, gate/up): one barrier
    /// instead of one per matrix. Falls back to one call each unless all are quantized.
    pub fn matmul_many(jobs: &mut [(&Matrix, &mut [f32])], x: &[f32], qa: &QActs) {
        let all_quant = qa.n > 0
            && jobs
                .iter()
                .all(|(m, _)| matches!(m.data, MatrixData::Quant(_)));
        if !all_quant {
            for (m, out) in jobs.iter_mut() {
                m.matmul(x, qa, out);
            }
            return;
        }
        let n = x.len() / jobs[0].0.cols;
        assert!(qa.n == n, "activations not quantized for this matmul");
        // Group index space: the matrices' row groups laid end to end.
        let parts: Vec<(&Packed, SendPtr, usize, usize)> = jobs
            .iter_mut()
            .map(|(m, out)| {
                let MatrixData::Quant(p) = &m.data else {
                    unreachable!()
                };
                assert!(p.cols == qa.k && out.len() == n * m.rows);
                assert_halves(p, qa);
                (&**p, SendPtr(out.as_mut_ptr()), m.rows, p.groups())
            })
            .collect();
        let total: usize = parts.iter().map(|p| p.3).sum();
        par_ranges(total, |g0, g1| {
            let mut base = 0;
            for (p, out, m, groups) in &parts {
                let (lo, hi) = (g0.max(base), g1.min(base + groups));
                if lo < hi {
                    // SAFETY: each task writes only the rows of its own groups.
                    unsafe { p.matmul_groups(qa, lo - base, hi - base, out.0, *m) };
                }
                base += groups;
            }
        });
    }
}

/// A quantiser of f32 rows into GGML blocks.
pub type Quantiser = fn(&[f32]) -> Vec<u8>;

/// The type rows of `cols` inputs asked for in `ty` get, and its quantiser (see
/// [`Matrix::quantized`] for the fallbacks); `None` for a type with no quantiser here.
pub fn quantiser(ty: GgmlType, cols: usize) -> Option<(GgmlType, Quantiser)> {
    use super::kquantize::{
        quantize_iq4_nl, quantize_iq4_xs, quantize_q2_k, quantize_q3_k, quantize_q4_k,
        quantize_q5_0, quantize_q5_1, quantize_q5_k, quantize_q6_k, QK_K,
    };
    let whole = cols.is_multiple_of(QK_K);
    Some(match ty {
        GgmlType::Q8_0 => (ty, quantize_q8_0),
        GgmlType::Q4_0 => (ty, quantize_q4_0),
        GgmlType::Q4_1 => (ty, quantize_q4_1),
        GgmlType::Q5_0 => (ty, quantize_q5_0),
        GgmlType::Q5_1 => (ty, quantize_q5_1),
        GgmlType::Q2_K if whole => (ty, quantize_q2_k),
        GgmlType::Q3_K if whole => (ty, quantize_q3_k),
        GgmlType::Q2_K | GgmlType::Q3_K => (GgmlType::Q4_0, quantize_q4_0),
        GgmlType::IQ4_XS if whole => (ty, quantize_iq4_xs),
        GgmlType::IQ4_XS | GgmlType::IQ4_NL => (GgmlType::IQ4_NL, quantize_iq4_nl),
        GgmlType::Q4_K if whole => (ty, quantize_q4_k),
        GgmlType::Q4_K => (GgmlType::Q5_0, quantize_q5_0),
        GgmlType::Q5_K if whole => (ty, quantize_q5_k),
        GgmlType::Q5_K => (GgmlType::Q5_1, quantize_q5_1),
        GgmlType::Q6_K if whole => (ty, quantize_q6_k),
        GgmlType::Q6_K => (GgmlType::Q8_0, quantize_q8_0),
        _ => return None,
    })
}

multiversion! {
    /// `out[t·m + r] = W[r]·x[t]` for rows `r0..r1` (`out` passed as an address so the
    /// function stays safe to call from the pool; callers own disjoint row ranges).
    fn dense_rows(w: &[f32], x: &[f32], k: usize, m: usize, r0: usize, r1: usize, out: usize) {
        let out = out as *mut f32;
        let n = x.len() / k;
        for r in r0..r1 {
            let wr = &w[r * k..(r + 1) * k];
            for t in 0..n {
                let y = dot(wr, &x[t * k..(t + 1) * k]);
                // SAFETY: (t, r) lies in this caller's rows of an n × m output.
                unsafe { *out.add(t * m + r) = y };
            }
        }
    }
}

/// Quantizes `x` into `qa` when any of the matrices about to multiply it takes int8 activations
/// (unless `exact` asks for f32 activations throughout); clears `qa` otherwise.
pub fn prep_acts(qa: &mut QActs, ms: &[&Matrix], x: &[f32], exact: bool) {
    if !exact && ms.iter().any(|m| m.wants_qacts()) {
        qa.quantize_with(x, ms[0].cols, ms.iter().any(|m| m.reads_half_sums()));
    } else {
        qa.clear();
    }
}

/// A kernel that reads the activations' sums per 16 inputs gets them ([`prep_acts`] computes
/// them only for the matrices it was given).
fn assert_halves(p: &Packed, qa: &QActs) {
    assert!(
        qa.halves || !p.fmt.half_sums(),
        "activations prepared without their sums per 16 for a {:?} matrix",
        p.fmt
    );
}

/// `v` resized to `n` (a scratch buffer reused across calls), as a slice.
pub fn sized(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    v.resize(n, 0.0);
    &mut v[..n]
}

/// Runs `f(t0..t1, rows)` over disjoint ranges of the rows (each `width` wide) of `out`, across
/// the pool when there are at least [`PAR_ROWS`] rows (per-token work of a batched forward).
pub fn par_rows(
    out: &mut [f32],
    width: usize,
    f: impl Fn(std::ops::Range<usize>, &mut [f32]) + Sync,
) {
    let n = out.len() / width;
    if n < PAR_ROWS {
        return f(0..n, out);
    }
    let p = SendPtr(out.as_mut_ptr());
    par_ranges(n, |t0, t1| {
        // SAFETY: ranges are disjoint and within `out`.
        let rows =
            unsafe { std::slice::from_raw_parts_mut(p.get().add(t0 * width), (t1 - t0) * width) };
        f(t0..t1, rows)
    });
}

/// f32 dot product with 8 independent accumulators (vectorises on any SIMD target).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_at(b: &[u8], i: usize) -> f32 {
        f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
    }

    fn q4_1_block(d: f32, m: f32, qs: [u8; 16]) -> Vec<u8> {
        let mut b = f16::from_f32(d).to_le_bytes().to_vec();
        b.extend(f16::from_f32(m).to_le_bytes());
        b.extend(qs);
        b
    }

    /// F16 dequantisation, in runs through `half`'s slice conversion, is the value-by-value
    /// conversion bit for bit: every one of the 65,536 halves (NaNs keep their payload), over
    /// lengths that end inside and on a run.
    #[test]
    fn f16_dequantisation_is_exact_for_every_half() {
        let all: Vec<u8> = (0..=u16::MAX).flat_map(|v| v.to_le_bytes()).collect();
        for n in [65_536, 300, 256, 7] {
            let mut got = vec![0f32; n];
            dequantize(GgmlType::F16, &all[..2 * n], &mut got);
            for (i, g) in got.iter().enumerate() {
                assert_eq!(g.to_bits(), f16_at(&all, 2 * i).to_bits(), "half {i:#06x}");
            }
        }
    }

    /// 600,000 floats from a xorshift stream seeded with `seed`: each state's bits as a float
    /// (every exponent, NaNs and infinities) and the state scaled into `offset..offset + span`.
    fn sweep(seed: u32, span: f32, offset: f32) -> Vec<f32> {
        xorshift(seed)
            .take(300_000)
            .flat_map(|s| {
                [
                    f32::from_bits(s),
                    (s as f32 / u32::MAX as f32) * span + offset,
                ]
            })
            .collect()
    }

    /// The states of a xorshift32 stream after `seed`.
    fn xorshift(seed: u32) -> impl Iterator<Item = u32> {
        std::iter::successors(Some(seed), |&s| {
            let s = s ^ (s << 13);
            let s = s ^ (s >> 17);
            Some(s ^ (s << 5))
        })
        .skip(1)
    }

    /// Rounding edges both roundf-free roundings are checked at: halves and their neighbours,
    /// signed zeros, infinities, NaN, the least subnormal and a huge value.
    const EDGES: [f32; 11] = [
        0.0,
        -0.0,
        0.5,
        -0.5,
        0.49999997,
        0.50000006,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-45,
        1e30,
    ];

    /// The roundf-free nibble is the rounded, clamped value for every input: halves and their
    /// neighbours, the clamp's edges, signed zeros, infinities, NaN and a sweep of floats.
    #[test]
    fn nibble_is_the_rounded_clamped_value() {
        let mut xs = EDGES.to_vec();
        xs.extend([1.5f32, 2.5, 14.5, 14.499999, 15.0, 15.5, 16.0, -3.0]);
        xs.extend(sweep(0x1234_5678, 17.0, -1.0));
        for x in xs {
            assert_eq!(nibble(x), x.round().clamp(0.0, 15.0) as u8, "{x:e}");
        }
    }

    /// The blockwise Q4_1 quantiser writes what a plain per-value reference (llama.cpp's rule
    /// as this file states it, with `f32::round`) writes, byte for byte: random blocks of
    /// several spreads, constant blocks, signed zeros and halves exactly between levels.
    #[test]
    fn q4_1_blocks_equal_the_per_value_reference() {
        fn reference(x: &[f32]) -> Vec<u8> {
            let mut out = Vec::new();
            for b in x.chunks_exact(QK) {
                let min = b.iter().copied().fold(f32::INFINITY, f32::min);
                let max = b.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let (d, m) = (f16::from_f32((max - min) / 15.0), f16::from_f32(min));
                out.extend_from_slice(&d.to_le_bytes());
                out.extend_from_slice(&m.to_le_bytes());
                let (d, m) = (d.to_f32(), m.to_f32());
                let id = if d > 0.0 { 1.0 / d } else { 0.0 };
                let q = |v: f32| ((v - m) * id).round().clamp(0.0, 15.0) as u8;
                out.extend((0..16).map(|j| q(b[j]) | (q(b[j + 16]) << 4)));
            }
            out
        }
        let mut states = xorshift(0x2545_f491);
        let mut x = Vec::new();
        for spread in [1e-3f32, 0.1, 1.0, 40.0] {
            x.extend(
                states
                    .by_ref()
                    .take(64 * QK)
                    .map(|s| (s as f32 / u32::MAX as f32 - 0.5) * spread),
            );
        }
        x.extend([0.75f32; QK]);
        x.extend((0..QK).map(|i| if i % 2 == 0 { 0.0 } else { -0.0 }));
        // Zero extremes of either sign beside other values, NaNs.
        x.extend((0..QK).map(|i| [0.0, -0.0, 0.1 * i as f32][i % 3]));
        x.extend((0..QK).map(|i| [-0.0, 0.0, -0.1 * i as f32][i % 3]));
        x.extend((0..QK).map(|i| if i == 5 { f32::NAN } else { i as f32 - 9.0 }));
        x.extend([f32::NAN; QK]);
        // Levels 0..15 and the halves between them (d = 1, m = 0).
        x.extend([0.0, 15.0, 7.5]);
        x.extend((0..15).map(|k| k as f32 + 0.5));
        x.extend((1..15).map(|k| k as f32));
        assert_eq!(quantize_q4_1(&x), reference(&x));
    }

    /// The roundf-free Q8_0 rounding is `x.round() as i8` for every input: halves and their
    /// neighbours of both signs, the saturation edges, signed zeros, infinities, NaN, floats
    /// of every exponent and a sweep of the quantiser's range.
    #[test]
    fn round_i8_is_the_rounded_saturated_value() {
        let mut xs = EDGES.to_vec();
        xs.extend([
            -0.49999997f32,
            1.5,
            -1.5,
            2.5,
            -2.5,
            126.5,
            -126.5,
            127.49999,
            127.5,
            -127.5,
            -128.5,
            -128.49998,
            200.0,
            -200.0,
            -1e30,
            8388607.5,
            8388608.0,
        ]);
        xs.extend(sweep(0x9e37_79b9, 260.0, -130.0));
        for x in xs {
            assert_eq!(round_i8(x), x.round() as i8, "{x:e}");
        }
    }

    #[test]
    fn q4_1_layout_low_nibbles_first() {
        let mut qs = [0u8; 16];
        qs[0] = 0x21; // x[0] = 1, x[16] = 2
        let b = q4_1_block(0.5, -1.0, qs);
        let mut out = [0f32; 32];
        dequantize(GgmlType::Q4_1, &b, &mut out);
        assert_eq!(out[0], 0.5 * 1.0 - 1.0);
        assert_eq!(out[16], 0.5 * 2.0 - 1.0);
        assert_eq!(out[1], -1.0);
    }

    #[test]
    fn matmul_matches_naive() {
        let (m, k, n) = (37, 64, 3);
        let w: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
            .collect();
        let x: Vec<f32> = (0..n * k)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.2)
            .collect();
        let mat = Matrix::from_f32(m, k, w.clone());
        let mut out = vec![0f32; n * m];
        mat.matmul(&x, &QActs::default(), &mut out);
        for t in 0..n {
            for r in 0..m {
                let want: f32 = (0..k).map(|i| w[r * k + i] * x[t * k + i]).sum();
                assert!((out[t * m + r] - want).abs() < 1e-4);
            }
        }
    }

    /// `prep_acts` skips the activations' sums per 16 inputs unless a matrix reads them (a
    /// serial pass over every value: 1.7 % of a 16-stream server's samples on a Q4_1 model),
    /// and what a matrix that does not read them computes is the same either way.
    #[test]
    fn half_sums_only_where_a_matrix_reads_them() {
        let (rows, cols) = (32, 256);
        let mat = |ty: GgmlType| {
            let bytes: Vec<u8> = (0..rows * ty.row_bytes(cols))
                .map(|i| ((i * 131 + 7) % 251 % 60) as u8)
                .collect();
            Matrix::from_bytes(ty, rows, cols, &bytes)
        };
        let (q4, q6) = (mat(GgmlType::Q4_1), mat(GgmlType::Q6_K));
        assert!(!q4.reads_half_sums() && q6.reads_half_sums());
        let x: Vec<f32> = (0..3 * cols)
            .map(|i| ((i % 13) as f32 - 6.0) * 0.2)
            .collect();
        let (mut without, mut with) = (QActs::default(), QActs::default());
        prep_acts(&mut without, &[&q4], &x, false);
        prep_acts(&mut with, &[&q4, &q6], &x, false);
        assert!(!without.halves && with.halves);
        let (mut a, mut b) = (vec![0f32; 3 * rows], vec![0f32; 3 * rows]);
        q4.matmul(&x, &without, &mut a);
        q4.matmul(&x, &with, &mut b);
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        // A Q6_K product read from activations prepared with its sums equals the full path's.
        let mut c = vec![0f32; 3 * rows];
        q6.matmul(&x, &with, &mut c);
        let mut full = QActs::default();
        full.quantize(&x, cols);
        let mut d = vec![0f32; 3 * rows];
        q6.matmul(&x, &full, &mut d);
        assert_eq!(c, d);
    }

    #[test]
    fn select_rows_is_bit_exact_for_every_type() {
        let (rows, cols) = (40, 64);
        let pick = [39, 0, 17, 16, 5, 33];
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::F32,
        ] {
            let bytes: Vec<u8> = (0..rows * ty.row_bytes(cols))
                // Bytes below 60 keep every f16 scale and f32 value finite and small.
                .map(|i| ((i * 131 + 7) % 251 % 60) as u8)
                .collect();
            let full = Matrix::from_bytes(ty, rows, cols, &bytes);
            let sub = full.select_rows(&pick);
            assert_eq!(sub.rows, pick.len());
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            for (i, &r) in pick.iter().enumerate() {
                full.row_into(r, &mut a);
                sub.row_into(i, &mut b);
                assert_eq!(
                    a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{ty:?} row {r}"
                );
            }
            // And the kernels agree: the subset's products are the full matrix's rows.
            let x: Vec<f32> = (0..2 * cols)
                .map(|i| ((i % 9) as f32 - 4.0) * 0.25)
                .collect();
            let mut qa = QActs::default();
            if full.wants_qacts() {
                qa.quantize(&x, cols);
            }
            let mut of = vec![0f32; 2 * rows];
            let mut os = vec![0f32; 2 * pick.len()];
            full.matmul(&x, &qa, &mut of);
            sub.matmul(&x, &qa, &mut os);
            for t in 0..2 {
                for (i, &r) in pick.iter().enumerate() {
                    let (u, v) = (of[t * rows + r], os[t * pick.len() + i]);
                    assert!(
                        (u - v).abs() <= 1e-5 * u.abs().max(1.0),
                        "{ty:?} {u} vs {v}"
                    );
                }
            }
        }
    }

    #[test]
    fn q4_1_quantiser_round_trips_within_half_a_step() {
        // Blocks with negative, positive and mixed ranges, and a constant block.
        let mut x: Vec<f32> = (0..128)
            .map(|i| ((i * 37 % 29) as f32 - 9.0) * 0.021 + (i / 32) as f32 * 0.3)
            .collect();
        x[96..128].fill(0.7);
        let q = quantize_q4_1(&x);
        assert_eq!(q.len(), 4 * 20);
        let mut y = vec![0f32; 128];
        dequantize(GgmlType::Q4_1, &q, &mut y);
        for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            let d = f16_at(&q[b * 20..], 0);
            let (lo, hi) = xb
                .iter()
                .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
            // Half a step, plus what f16 rounding of d and m can shift the top level by.
            let tol = 0.5 * d
                + 15.0 * ((hi - lo) / 15.0 - d).abs()
                + (lo - f16_at(&q[b * 20..], 2)).abs()
                + 1e-6;
            for (a, c) in xb.iter().zip(yb) {
                assert!(
                    (a - c).abs() <= tol,
                    "block {b}: {a} vs {c} (tolerance {tol})"
                );
            }
        }
    }

    /// Q4_0 bytes equal llama.cpp's reference quantiser's (the `gguf` Python package's
    /// `quants.quantize`, run once for these values; the second block's largest magnitude is
    /// negative).
    #[test]
    fn q4_0_quantiser_writes_the_reference_bytes() {
        let mut x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 29) as f32 - 9.0) * 0.021 + (i / 32) as f32 * 0.3)
            .collect();
        x[40] = -1.3;
        let want: [u8; 36] = [
            98, 170, 124, 56, 5, 146, 91, 39, 180, 128, 73, 22, 163, 107, 56, 197, 129, 90, 51, 49,
            172, 185, 202, 155, 172, 185, 202, 156, 160, 186, 155, 172, 185, 202, 155, 172,
        ];
        assert_eq!(quantize_q4_0(&x), want);
        // A dense matrix quantized to each type holds what that type's bytes hold; a K-quant
        // of rows that are not whole 256-blocks falls back as llama-quantize's does.
        use super::super::kquantize::{
            quantize_iq4_nl, quantize_iq4_xs, quantize_q2_k, quantize_q3_k, quantize_q4_k,
            quantize_q5_0, quantize_q5_1, quantize_q5_k, quantize_q6_k,
        };
        let wide: Vec<f32> = (0..512)
            .map(|i| x[i % 64] * (1.0 + i as f32 / 512.0))
            .collect();
        for (ty, cols, stored) in [
            (GgmlType::Q8_0, 32, GgmlType::Q8_0),
            (GgmlType::Q4_0, 32, GgmlType::Q4_0),
            (GgmlType::Q4_1, 32, GgmlType::Q4_1),
            (GgmlType::Q5_0, 32, GgmlType::Q5_0),
            (GgmlType::Q4_K, 256, GgmlType::Q4_K),
            (GgmlType::Q6_K, 256, GgmlType::Q6_K),
            (GgmlType::Q5_K, 256, GgmlType::Q5_K),
            (GgmlType::Q5_1, 32, GgmlType::Q5_1),
            (GgmlType::Q5_K, 32, GgmlType::Q5_1),
            (GgmlType::Q4_K, 32, GgmlType::Q5_0),
            (GgmlType::Q6_K, 32, GgmlType::Q8_0),
            (GgmlType::Q3_K, 256, GgmlType::Q3_K),
            (GgmlType::Q2_K, 256, GgmlType::Q2_K),
            (GgmlType::Q3_K, 32, GgmlType::Q4_0),
            (GgmlType::Q2_K, 32, GgmlType::Q4_0),
            (GgmlType::IQ4_XS, 256, GgmlType::IQ4_XS),
            (GgmlType::IQ4_XS, 32, GgmlType::IQ4_NL),
            (GgmlType::IQ4_NL, 32, GgmlType::IQ4_NL),
        ] {
            let v = if cols == 32 { x.clone() } else { wide.clone() };
            let m = Matrix::from_f32(2, cols, v.clone()).quantized(ty);
            assert!(m.wants_qacts(), "{ty:?}");
            assert_eq!(m.ty(), stored, "{ty:?} of {cols} columns");
            let mut row = vec![0f32; cols];
            m.row_into(1, &mut row);
            let mut want = vec![0f32; cols];
            let quantize = match stored {
                GgmlType::Q8_0 => quantize_q8_0,
                GgmlType::Q4_0 => quantize_q4_0,
                GgmlType::Q4_1 => quantize_q4_1,
                GgmlType::Q5_0 => quantize_q5_0,
                GgmlType::Q5_1 => quantize_q5_1,
                GgmlType::Q4_K => quantize_q4_k,
                GgmlType::Q5_K => quantize_q5_k,
                GgmlType::Q3_K => quantize_q3_k,
                GgmlType::Q2_K => quantize_q2_k,
                GgmlType::IQ4_XS => quantize_iq4_xs,
                GgmlType::IQ4_NL => quantize_iq4_nl,
                _ => quantize_q6_k,
            };
            dequantize(stored, &quantize(&v[cols..]), &mut want);
            assert_eq!(row, want, "{ty:?}");
        }
    }

    #[test]
    fn q8_0_quantiser_round_trips_within_half_a_step() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.013)
            .collect();
        let q = quantize_q8_0(&x);
        assert_eq!(q.len(), 3 * 34);
        let mut y = vec![0f32; 96];
        dequantize(GgmlType::Q8_0, &q, &mut y);
        for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let step = amax / 127.0;
            for (a, c) in xb.iter().zip(yb) {
                assert!(
                    (a - c).abs() <= 0.5 * step * 1.01 + 1e-6,
                    "block {b}: {a} vs {c}"
                );
            }
        }
    }
}
