//! Quantisers for `--quantize q2_k|q3_k|q4_k|q5_k|q6_k|iq4_nl|iq4_xs`: GGML's Q2_K, Q3_K, Q4_K,
//! Q5_K, Q6_K, IQ4_NL and IQ4_XS blocks (layouts in
//! [`super::blocks`]) and the Q5_0 / Q5_1 fallbacks llama-quantize uses where a row is not a
//! whole number of 256-blocks.
//!
//! Q5_0 and Q5_1 are llama.cpp's reference rules (bytes tested against the `gguf` package's). The K-quant
//! scales are found the way llama.cpp's reference quantisers find them, written here from the
//! method, not from its code: per sub-block a small search over candidate scales, each refit
//! by weighted least squares on the levels it gives (weights grow with |x|, so large weights —
//! the ones that move a dot product — are met more closely), then the sub-block scales (and
//! mins) are themselves quantized against one f16 scale per 256 values and the levels
//! recomputed with the stored scales, so every value lands within half a level of the grid it
//! is read back on (up to clipping at the ends of the range). The bytes are not llama.cpp's
//! (there is no reference to compare them with here); what they cost is measured in
//! docs/gguf.md.

use super::blocks::{scale_min_k4, IQ4_VALUES};
use super::ggml::QK;
use half::f16;

/// Elements per K-quant block.
pub const QK_K: usize = 256;

/// The value of largest magnitude, with its sign (the first of equals; 0 for none): the anchor
/// of llama.cpp's symmetric quantisers.
pub(crate) fn signed_amax(x: &[f32]) -> f32 {
    x.iter()
        .copied()
        .fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m })
}

/// Quantises `x` (a multiple of 32) to Q5_0 blocks by llama.cpp's reference rule: per 32 values
/// the one of largest magnitude m, an f16 scale d = m / −16, levels min(31, trunc(x / d +
/// 16.5)), the low four bits in nibbles (inputs 0..16 low) and the fifth bits in a u32.
pub fn quantize_q5_0(x: &[f32]) -> Vec<u8> {
    assert!(x.len().is_multiple_of(QK), "Q5_0 needs whole blocks of 32");
    let mut out = Vec::with_capacity(x.len() / QK * 22);
    for b in x.chunks_exact(QK) {
        let m = signed_amax(b);
        let d = m / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: Vec<u8> = b.iter().map(|&v| ((v * id + 16.5) as u8).min(31)).collect();
        let qh = q
            .iter()
            .enumerate()
            .fold(0u32, |h, (j, &l)| h | (((l >> 4) as u32) << j));
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend_from_slice(&qh.to_le_bytes());
        out.extend((0..16).map(|j| (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4)));
    }
    out
}

/// Quantises `x` (a multiple of 32) to Q5_1 blocks by llama.cpp's reference rule: per 32 values
/// d = (max − min) / 31 and the min as f16, levels min(31, trunc((x − min) / d + 0.5)) (d and
/// min in f32), the low four bits in nibbles (inputs 0..16 low) and the fifth bits in a u32.
pub fn quantize_q5_1(x: &[f32]) -> Vec<u8> {
    assert!(x.len().is_multiple_of(QK), "Q5_1 needs whole blocks of 32");
    let mut out = Vec::with_capacity(x.len() / QK * 24);
    for b in x.chunks_exact(QK) {
        let min = b.iter().copied().fold(f32::INFINITY, f32::min);
        let max = b.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: Vec<u8> = b
            .iter()
            .map(|&v| (((v - min) * id + 0.5) as u8).min(31))
            .collect();
        let qh = q
            .iter()
            .enumerate()
            .fold(0u32, |h, (j, &l)| h | (((l >> 4) as u32) << j));
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
        out.extend_from_slice(&qh.to_le_bytes());
        out.extend((0..16).map(|j| (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4)));
    }
    out
}

/// `v` clamped to `lo..=hi` (|lo|, |hi| < 2²²) and rounded to the nearest integer, ties to
/// even: the f32 magic-number rounding, which vectorises where `f32::round` is a library call
/// (clamping first keeps it exact however far out `v` lies; NaN stays NaN, which `as` casts
/// to 0).
#[inline(always)]
fn nearest(v: f32, lo: f32, hi: f32) -> f32 {
    (v.clamp(lo, hi) + 12_582_912.0) - 12_582_912.0
}

/// `Σ w·l`, `Σ w·l²`, `Σ w·l·x` over a sub-block (a multiple of 8 values) with levels
/// `l = nearest(clamp(iscale · (x − lo), l0, l1))`, in 8 independent lanes (the search's inner
/// loop: one dependent chain of adds would leave it latency-bound).
#[inline(always)]
fn level_sums(x: &[f32], w: &[f32], iscale: f32, lo: f32, l0: f32, l1: f32) -> (f32, f32, f32) {
    let mut acc = [[0f32; 8]; 3];
    for (xc, wc) in x.chunks_exact(8).zip(w.chunks_exact(8)) {
        for k in 0..8 {
            let l = nearest(iscale * (xc[k] - lo), l0, l1);
            acc[0][k] += wc[k] * l;
            acc[1][k] += wc[k] * l * l;
            acc[2][k] += wc[k] * l * xc[k];
        }
    }
    let sum = |a: [f32; 8]| a.iter().sum::<f32>();
    (sum(acc[0]), sum(acc[1]), sum(acc[2]))
}

/// Weighted sums over a sub-block of `Σ w`, `Σ w·x`, `Σ w·x²`.
fn moments(x: &[f32], w: &[f32]) -> (f32, f32, f32) {
    x.iter()
        .zip(w)
        .fold((0.0, 0.0, 0.0), |(a, b, c), (&x, &w)| {
            (a + w, b + w * x, c + w * x * x)
        })
}

/// Scale and (non-positive) offset of `x ≈ scale · l + off`, `l` in 0..=`nmax`, by a search
/// over candidate scales, each refit by weighted least squares on the levels it gives (an
/// offset above zero is clamped to zero and the scale refit alone); the error of each fit is
/// read from the same sums. Returns `(scale, −off)`, both ≥ 0.
fn scale_min(x: &[f32], w: &[f32], nmax: i32) -> (f32, f32) {
    let lo = x.iter().copied().fold(f32::INFINITY, f32::min).min(0.0);
    let hi = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if hi <= lo {
        return (0.0, -lo);
    }
    let (sw, sx, sxx) = moments(x, w);
    let err = |s: f32, o: f32, sl: f32, sll: f32, slx: f32| {
        s * s * sll + 2.0 * s * o * sl + o * o * sw - 2.0 * s * slx - 2.0 * o * sx + sxx
    };
    let (mut best, mut best_err) = (((hi - lo) / nmax as f32, lo), f32::INFINITY);
    for step in -1..=20 {
        // Candidate −1: the plain (max − min) / nmax grid, unrefit.
        let iscale = if step < 0 {
            nmax as f32 / (hi - lo)
        } else {
            (nmax as f32 - 1.0 + 0.1 * step as f32) / (hi - lo)
        };
        let (sl, sll, slx) = level_sums(x, w, iscale, lo, 0.0, nmax as f32);
        let (s, o) = if step < 0 {
            best
        } else {
            let det = sw * sll - sl * sl;
            if det <= 0.0 {
                continue;
            }
            let (s, o) = ((sw * slx - sx * sl) / det, (sll * sx - sl * slx) / det);
            if o > 0.0 {
                (if sll > 0.0 { slx / sll } else { 0.0 }, 0.0)
            } else {
                (s, o)
            }
        };
        let e = err(s, o, sl, sll, slx);
        if s > 0.0 && e < best_err {
            (best, best_err) = ((s, o), e);
        }
    }
    (best.0, -best.1)
}

/// Scale of `x ≈ scale · l`, `l` in −`n`..`n` − 1, by a search over candidate scales each refit
/// by weighted least squares (whose error is `Σ w·x² − (Σ w·l·x)² / Σ w·l²`: the best fit has
/// the largest `(Σ w·l·x)² / Σ w·l²`); the sign is that of the largest-magnitude value's side.
fn scale_signed(x: &[f32], w: &[f32], n: i32) -> f32 {
    let m = signed_amax(x);
    if m == 0.0 {
        return 0.0;
    }
    let (mut best, mut best_gain) = (0f32, f32::NEG_INFINITY);
    for step in -9..=9 {
        let iscale = -(n as f32 + 0.1 * step as f32) / m;
        let (_, sll, slx) = level_sums(x, w, iscale, 0.0, -n as f32, n as f32 - 1.0);
        if sll > 0.0 && slx * slx / sll > best_gain {
            (best, best_gain) = (slx / sll, slx * slx / sll);
        }
    }
    best
}

/// Rounds `v / max · 63` to 0..=63 (0 when `max` is 0).
fn six_bits(v: f32, max: f32) -> u8 {
    if max > 0.0 {
        nearest(v * (63.0 / max), 0.0, 63.0) as u8
    } else {
        0
    }
}

/// Quantises `x` (a multiple of 256) to Q4_K blocks: per 32 values a 6-bit scale and min, per
/// 256 an f16 `d` and `dmin`, 4-bit levels with x ≈ l · (d · sc) − dmin · m.
pub fn quantize_q4_k(x: &[f32]) -> Vec<u8> {
    assert!(
        x.len().is_multiple_of(QK_K),
        "Q4_K needs whole blocks of 256"
    );
    let mut out = Vec::with_capacity(x.len() / QK_K * 144);
    for blk in x.chunks_exact(QK_K) {
        let (head, l) = k_block(blk, 15);
        out.extend_from_slice(&head);
        for c in 0..4 {
            out.extend((0..32).map(|i| l[c * 64 + i] | (l[c * 64 + 32 + i] << 4)));
        }
    }
    out
}

/// Quantises `x` (a multiple of 256) to Q5_K blocks: Q4_K's scales and mins with 5-bit levels,
/// their fifth bits in a plane of 32 bytes before the nibbles.
pub fn quantize_q5_k(x: &[f32]) -> Vec<u8> {
    assert!(
        x.len().is_multiple_of(QK_K),
        "Q5_K needs whole blocks of 256"
    );
    let mut out = Vec::with_capacity(x.len() / QK_K * 176);
    for blk in x.chunks_exact(QK_K) {
        let (head, l) = k_block(blk, 31);
        out.extend_from_slice(&head);
        out.extend((0..32).map(|i| {
            (0..4).fold(0u8, |h, c| {
                h | ((l[c * 64 + i] >> 4) << (2 * c)) | ((l[c * 64 + 32 + i] >> 4) << (2 * c + 1))
            })
        }));
        for c in 0..4 {
            out.extend((0..32).map(|i| (l[c * 64 + i] & 0xF) | ((l[c * 64 + 32 + i] & 0xF) << 4)));
        }
    }
    out
}

/// One 256-block of Q4_K (`nmax` 15) or Q5_K (31): its `d`, `dmin` and packed scales (the 16
/// bytes before the levels) and its levels 0..=nmax.
fn k_block(blk: &[f32], nmax: i32) -> ([u8; 16], [u8; QK_K]) {
    let mut sub = [(0f32, 0f32); 8];
    for (j, xs) in blk.chunks_exact(32).enumerate() {
        let rms = (xs.iter().map(|v| v * v).sum::<f32>() / 32.0).sqrt();
        let w: [f32; 32] = std::array::from_fn(|i| rms + xs[i].abs());
        sub[j] = scale_min(xs, &w, nmax);
    }
    let max_s = sub.iter().fold(0f32, |m, s| m.max(s.0));
    let max_m = sub.iter().fold(0f32, |m, s| m.max(s.1));
    let ls: Vec<u8> = sub.iter().map(|s| six_bits(s.0, max_s)).collect();
    let lm: Vec<u8> = sub.iter().map(|s| six_bits(s.1, max_m)).collect();
    let (d, dmin) = (f16::from_f32(max_s / 63.0), f16::from_f32(max_m / 63.0));
    let mut scales = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            scales[j] |= ls[j];
            scales[j + 4] |= lm[j];
        } else {
            scales[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            scales[j - 4] |= (ls[j] >> 4) << 6;
            scales[j] |= (lm[j] >> 4) << 6;
        }
    }
    let mut l = [0u8; QK_K];
    for (j, (xs, ls)) in blk.chunks_exact(32).zip(l.chunks_exact_mut(32)).enumerate() {
        // The scale and min as the dequantiser reads them back.
        let (s, m) = scale_min_k4(j, &scales);
        let (step, off) = (d.to_f32() * s as f32, dmin.to_f32() * m as f32);
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = if step > 0.0 {
                nearest((v + off) / step, 0.0, nmax as f32) as u8
            } else {
                0
            };
        }
    }
    let mut head = [0u8; 16];
    head[..2].copy_from_slice(&d.to_le_bytes());
    head[2..4].copy_from_slice(&dmin.to_le_bytes());
    head[4..].copy_from_slice(&scales);
    (head, l)
}

/// One 256-block of signed levels per 16 values (Q6_K: `n` 32, Q3_K: 4): each sub-block's scale
/// by [`scale_signed`] (weights x²), the scales as signed integers −`smax`..`smax` − 1 against
/// one f16 `d`, and the levels −`n`..`n` − 1 recomputed on the stored scales, returned + `n`.
fn signed_sub_blocks(blk: &[f32], n: i32, smax: i32) -> (f16, [i8; 16], [u8; QK_K]) {
    let mut sub = [0f32; 16];
    for (j, xs) in blk.chunks_exact(16).enumerate() {
        let w: [f32; 16] = std::array::from_fn(|i| xs[i] * xs[i]);
        sub[j] = scale_signed(xs, &w, n);
    }
    let m = signed_amax(&sub);
    let (d, sc): (f16, [i8; 16]) = if m == 0.0 {
        (f16::ZERO, [0; 16])
    } else {
        let (iscale, lim) = (-smax as f32 / m, smax as f32);
        let sc = sub.map(|s| nearest(iscale * s, -lim, lim - 1.0) as i8);
        (f16::from_f32(1.0 / iscale), sc)
    };
    let mut l = [0u8; QK_K];
    let lim = n as f32;
    for (j, (xs, ls)) in blk.chunks_exact(16).zip(l.chunks_exact_mut(16)).enumerate() {
        let step = d.to_f32() * sc[j] as f32;
        for (l, &v) in ls.iter_mut().zip(xs) {
            let q = if step != 0.0 {
                nearest(v / step, -lim, lim - 1.0) as i32
            } else {
                0
            };
            *l = (q + n) as u8;
        }
    }
    (d, sc, l)
}

/// Quantises `x` (a multiple of 256) to Q6_K blocks: per 16 values an i8 scale, per 256 an f16
/// `d`, 6-bit levels −32..31 with x ≈ l · (d · sc).
pub fn quantize_q6_k(x: &[f32]) -> Vec<u8> {
    assert!(
        x.len().is_multiple_of(QK_K),
        "Q6_K needs whole blocks of 256"
    );
    let mut out = Vec::with_capacity(x.len() / QK_K * 210);
    for blk in x.chunks_exact(QK_K) {
        let (d, sc, l) = signed_sub_blocks(blk, 32, 128);
        let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
        for n in 0..2 {
            let y = &l[n * 128..];
            for i in 0..32 {
                ql[n * 64 + i] = (y[i] & 0xF) | ((y[i + 64] & 0xF) << 4);
                ql[n * 64 + i + 32] = (y[i + 32] & 0xF) | ((y[i + 96] & 0xF) << 4);
                qh[n * 32 + i] = (y[i] >> 4)
                    | ((y[i + 32] >> 4) << 2)
                    | ((y[i + 64] >> 4) << 4)
                    | ((y[i + 96] >> 4) << 6);
            }
        }
        out.extend_from_slice(&ql);
        out.extend_from_slice(&qh);
        out.extend(sc.iter().map(|&s| s as u8));
        out.extend_from_slice(&d.to_le_bytes());
    }
    out
}

/// Packs levels 0..=3 (two bits) of one 256-block four a byte as GGML's Q2_K and Q3_K do: byte
/// `32·h + i` holds, at bits `2·j`, level `128·h + 32·j + i`.
fn two_bit_plane(l: &[u8; QK_K]) -> [u8; 64] {
    std::array::from_fn(|b| {
        let (h, i) = (b / 32, b % 32);
        (0..4).fold(0u8, |q, j| q | ((l[128 * h + 32 * j + i] & 3) << (2 * j)))
    })
}

/// Rounds `v / max · 15` to 0..=15 (0 when `max` is 0).
fn four_bits(v: f32, max: f32) -> u8 {
    if max > 0.0 {
        nearest(v * (15.0 / max), 0.0, 15.0) as u8
    } else {
        0
    }
}

/// Quantises `x` (a multiple of 256) to Q2_K blocks: per 16 values a 4-bit scale and min, per
/// 256 an f16 `d` and `dmin`, 2-bit levels with x ≈ l · (d · sc) − dmin · m.
pub fn quantize_q2_k(x: &[f32]) -> Vec<u8> {
    assert!(
        x.len().is_multiple_of(QK_K),
        "Q2_K needs whole blocks of 256"
    );
    let mut out = Vec::with_capacity(x.len() / QK_K * 84);
    for blk in x.chunks_exact(QK_K) {
        let mut sub = [(0f32, 0f32); 16];
        for (j, xs) in blk.chunks_exact(16).enumerate() {
            let w: [f32; 16] = std::array::from_fn(|i| xs[i].abs());
            sub[j] = scale_min(xs, &w, 3);
        }
        let max_s = sub.iter().fold(0f32, |m, s| m.max(s.0));
        let max_m = sub.iter().fold(0f32, |m, s| m.max(s.1));
        let sc: [u8; 16] = std::array::from_fn(|j| four_bits(sub[j].0, max_s));
        let mn: [u8; 16] = std::array::from_fn(|j| four_bits(sub[j].1, max_m));
        let (d, dmin) = (f16::from_f32(max_s / 15.0), f16::from_f32(max_m / 15.0));
        let mut l = [0u8; QK_K];
        for (j, (xs, ls)) in blk.chunks_exact(16).zip(l.chunks_exact_mut(16)).enumerate() {
            // The scale and min as the dequantiser reads them back.
            let (step, off) = (d.to_f32() * sc[j] as f32, dmin.to_f32() * mn[j] as f32);
            for (l, &v) in ls.iter_mut().zip(xs) {
                *l = if step > 0.0 {
                    nearest((v + off) / step, 0.0, 3.0) as u8
                } else {
                    0
                };
            }
        }
        out.extend((0..16).map(|j| sc[j] | (mn[j] << 4)));
        out.extend_from_slice(&two_bit_plane(&l));
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&dmin.to_le_bytes());
    }
    out
}

/// Quantises `x` (a multiple of 256) to Q3_K blocks: per 16 values a 6-bit scale (stored + 32),
/// per 256 an f16 `d`, 3-bit levels −4..3 with x ≈ l · (d · sc): the levels' third bits (set
/// when l ≥ 0) in a 32-byte mask plane, their low two bits four a byte, then the 12 bytes of
/// scales.
pub fn quantize_q3_k(x: &[f32]) -> Vec<u8> {
    assert!(
        x.len().is_multiple_of(QK_K),
        "Q3_K needs whole blocks of 256"
    );
    let mut out = Vec::with_capacity(x.len() / QK_K * 110);
    for blk in x.chunks_exact(QK_K) {
        // Level + 4 (0..7).
        let (d, sc, l) = signed_sub_blocks(blk, 4, 32);
        // Value k's third bit: byte k % 32 of the mask plane, bit k / 32.
        let hmask: [u8; 32] =
            std::array::from_fn(|i| (0..8).fold(0u8, |h, b| h | ((l[32 * b + i] >> 2) << b)));
        let mut scales = [0u8; 12];
        for (j, &s) in sc.iter().enumerate() {
            let v = (s as i32 + 32) as u8;
            scales[j % 8] |= (v & 0xF) << (4 * (j / 8));
            scales[8 + j % 4] |= (v >> 4) << (2 * (j / 4));
        }
        out.extend_from_slice(&hmask);
        out.extend_from_slice(&two_bit_plane(&l));
        out.extend_from_slice(&scales);
        out.extend_from_slice(&d.to_le_bytes());
    }
    out
}

/// The index of the [`IQ4_VALUES`] level nearest `v` (ties to the lower level).
fn iq4_nearest(v: f32) -> u8 {
    let i = IQ4_VALUES.partition_point(|&l| (l as f32) < v);
    if i == 0 {
        0
    } else if i == 16 || v - IQ4_VALUES[i - 1] as f32 <= IQ4_VALUES[i] as f32 - v {
        i as u8 - 1
    } else {
        i as u8
    }
}

/// Scale of `x ≈ scale · IQ4_VALUES[i]` by a search over candidate scales that put the
/// largest-magnitude value at or near either end of the (asymmetric) table, each refit by
/// weighted least squares (the best fit has the largest `(Σ w·q·x)² / Σ w·q²`).
fn iq4_scale(x: &[f32], w: &[f32]) -> f32 {
    let m = signed_amax(x);
    if m == 0.0 {
        return 0.0;
    }
    let (mut best, mut best_gain) = (0f32, f32::NEG_INFINITY);
    for sign in [1.0f32, -1.0] {
        for t in 0..=14 {
            let iscale = sign * (127.0 - t as f32) / m;
            let (mut sqx, mut sqq) = (0f32, 0f32);
            for (&v, &w) in x.iter().zip(w) {
                let q = IQ4_VALUES[iq4_nearest(iscale * v) as usize] as f32;
                sqx += w * q * v;
                sqq += w * q * q;
            }
            if sqq > 0.0 && sqx * sqx / sqq > best_gain {
                (best, best_gain) = (sqx / sqq, sqx * sqx / sqq);
            }
        }
    }
    best
}

/// The nibbles of 32 IQ4 indices as ggml stores a 32-block: byte `j` holds index `j` low and
/// index `j + 16` high.
fn iq4_nibbles(x: &[f32], step: f32, out: &mut Vec<u8>) {
    let idx: Vec<u8> = x
        .iter()
        .map(|&v| {
            if step != 0.0 {
                iq4_nearest(v / step)
            } else {
                iq4_nearest(0.0)
            }
        })
        .collect();
    out.extend((0..16).map(|j| idx[j] | (idx[j + 16] << 4)));
}

/// Quantises `x` (a multiple of 32) to IQ4_NL blocks: per 32 values an f16 scale and 4-bit
/// indices into the fixed non-uniform table [`IQ4_VALUES`].
pub fn quantize_iq4_nl(x: &[f32]) -> Vec<u8> {
    assert!(
        x.len().is_multiple_of(32),
        "IQ4_NL needs whole blocks of 32"
    );
    let mut out = Vec::with_capacity(x.len() / 32 * 18);
    for xs in x.chunks_exact(32) {
        let w: Vec<f32> = xs.iter().map(|v| v * v).collect();
        let d = f16::from_f32(iq4_scale(xs, &w));
        out.extend_from_slice(&d.to_le_bytes());
        iq4_nibbles(xs, d.to_f32(), &mut out);
    }
    out
}

/// Quantises `x` (a multiple of 256) to IQ4_XS blocks: per 32 values a 6-bit scale (stored
/// plus 32: low nibbles two a byte, high two bits in a u16), per 256 an f16 `d`, the IQ4_NL
/// table's indices.
pub fn quantize_iq4_xs(x: &[f32]) -> Vec<u8> {
    assert!(
        x.len().is_multiple_of(QK_K),
        "IQ4_XS needs whole blocks of 256"
    );
    let mut out = Vec::with_capacity(x.len() / QK_K * 136);
    for blk in x.chunks_exact(QK_K) {
        let sub: Vec<f32> = blk
            .chunks_exact(32)
            .map(|xs| iq4_scale(xs, &xs.iter().map(|v| v * v).collect::<Vec<_>>()))
            .collect();
        let m = signed_amax(&sub);
        let (d, ls): (f16, [i8; 8]) = if m == 0.0 {
            (f16::ZERO, [0; 8])
        } else {
            let iscale = -32.0 / m;
            let ls = std::array::from_fn(|ib| nearest(iscale * sub[ib], -32.0, 31.0) as i8);
            (f16::from_f32(1.0 / iscale), ls)
        };
        let (mut sh, mut sl) = (0u16, [0u8; 4]);
        for (ib, &l) in ls.iter().enumerate() {
            let v = (l as i32 + 32) as u8;
            sl[ib / 2] |= (v & 0xF) << (4 * (ib % 2));
            sh |= ((v >> 4) as u16) << (2 * ib);
        }
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&sh.to_le_bytes());
        out.extend_from_slice(&sl);
        for (xs, &l) in blk.chunks_exact(32).zip(&ls) {
            iq4_nibbles(xs, d.to_f32() * l as f32, &mut out);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::quant::{dequantize, GgmlType};

    /// Q5_0 bytes equal llama.cpp's reference quantiser's (the `gguf` package's
    /// `quants.quantize`, run once for these values: the second block's largest magnitude is
    /// negative, the first's positive).
    #[test]
    fn q5_0_and_q5_1_quantisers_write_the_reference_bytes() {
        let mut x: Vec<f32> = (0..64)
            .map(|i| (((i * 37 % 29) as f64 - 9.0) * 0.021 + (i / 32) as f64 * 0.3) as f32)
            .collect();
        x[40] = -1.3;
        x[7] = 0.9;
        let want: [u8; 44] = [
            51, 171, 19, 153, 200, 100, 243, 192, 157, 26, 226, 191, 60, 0, 209, 174, 27, 243, 192,
            61, 10, 210, 51, 45, 255, 254, 255, 255, 56, 82, 116, 38, 72, 99, 133, 55, 80, 116, 22,
            56, 98, 132, 39, 73,
        ];
        assert_eq!(quantize_q5_0(&x), want);
        // Q5_1 by the same package, the same values.
        let want: [u8; 48] = [
            127, 40, 12, 178, 128, 0, 4, 2, 112, 197, 26, 78, 146, 231, 27, 111, 180, 8, 61, 129,
            213, 10, 95, 162, 33, 44, 51, 189, 255, 254, 255, 255, 142, 183, 217, 124, 159, 200,
            234, 141, 160, 217, 107, 142, 183, 234, 124, 159,
        ];
        assert_eq!(quantize_q5_1(&x), want);
    }

    /// Deterministic values of a weight-like spread: mostly small, some rows scaled up, a few
    /// outliers.
    fn weights(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        let mut unif = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 + 0.5) / (1u64 << 24) as f32
        };
        (0..n)
            .map(|i| {
                // A sum of uniforms: roughly normal, scaled per 256-block, with outliers.
                let g: f32 = (0..4).map(|_| unif() - 0.5).sum::<f32>() * 1.7;
                let scale = 0.02 * (1 + (i / 256) % 5) as f32;
                let out = if unif() < 0.01 { 6.0 } else { 1.0 };
                g * scale * out
            })
            .collect()
    }

    fn rel_rmse(ty: GgmlType, x: &[f32], bytes: &[u8]) -> f64 {
        assert_eq!(bytes.len(), x.len() / ty.block_len() * ty.block_bytes());
        let mut y = vec![0f32; x.len()];
        dequantize(ty, bytes, &mut y);
        let err: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let mag: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
        (err / mag).sqrt()
    }

    /// Read back by the dequantiser (ggml's layout), the K-quants land where their bit widths
    /// put them (measured: relative RMS error Q4_0 0.119, Q4_1 0.089, Q5_0 0.058, Q4_K 0.082,
    /// Q6_K 0.023): Q4_K below Q4_0 and Q4_1, Q6_K under 0.3 of Q4_K and half of Q5_0. A byte
    /// in the wrong place (a scale, a nibble, a high bit) moves values by whole steps and
    /// fails these bounds.
    #[test]
    fn k_quantisers_round_trip_through_ggml_layout() {
        use crate::runtime::quant::{quantize_q4_0, quantize_q4_1};
        let x = weights(256 * 40, 7);
        let q4_0 = rel_rmse(GgmlType::Q4_0, &x, &quantize_q4_0(&x));
        let q4_1 = rel_rmse(GgmlType::Q4_1, &x, &quantize_q4_1(&x));
        let q5_0 = rel_rmse(GgmlType::Q5_0, &x, &quantize_q5_0(&x));
        let q5_1 = rel_rmse(GgmlType::Q5_1, &x, &quantize_q5_1(&x));
        let q4_k = rel_rmse(GgmlType::Q4_K, &x, &quantize_q4_k(&x));
        let q5_k = rel_rmse(GgmlType::Q5_K, &x, &quantize_q5_k(&x));
        let q6_k = rel_rmse(GgmlType::Q6_K, &x, &quantize_q6_k(&x));
        let q3_k = rel_rmse(GgmlType::Q3_K, &x, &quantize_q3_k(&x));
        let q2_k = rel_rmse(GgmlType::Q2_K, &x, &quantize_q2_k(&x));
        let iq4_nl = rel_rmse(GgmlType::IQ4_NL, &x, &quantize_iq4_nl(&x));
        let iq4_xs = rel_rmse(GgmlType::IQ4_XS, &x, &quantize_iq4_xs(&x));
        eprintln!("rel rmse iq4_nl {iq4_nl:.4} iq4_xs {iq4_xs:.4}");
        // The non-uniform table beats the uniform grid at the same bits (measured: IQ4_NL 0.098
        // against Q4_0's 0.119), and IQ4_XS's 6-bit sub-scales under one f16 per 256 cost it
        // little (0.099; Q4_K, with a min as well, 0.082).
        assert!(
            iq4_nl < 0.9 * q4_0 && iq4_xs < 1.05 * iq4_nl,
            "{iq4_nl} {iq4_xs}"
        );
        eprintln!(
            "rel rmse q2_k {q2_k:.4} q3_k {q3_k:.4} q4_0 {q4_0:.4} q4_1 {q4_1:.4} q5_0 {q5_0:.4} \
             q5_1 {q5_1:.4} q4_k {q4_k:.4} q5_k {q5_k:.4} q6_k {q6_k:.4}"
        );
        // Each bit fewer roughly doubles the error: Q3_K between Q4_K and twice… three times
        // it, Q2_K above Q3_K and below three times it.
        assert!(q3_k > q4_k && q3_k < 3.0 * q4_k, "q3_k {q3_k}");
        assert!(q2_k > q3_k && q2_k < 3.0 * q3_k, "q2_k {q2_k}");
        // Sub-blocks of 16 whose magnitudes differ 64-fold (and some all of one sign): a scale,
        // min or mask bit read back for the wrong sub-block, or a level in the wrong place,
        // costs whole multiples of the error (measured: Q2_K 0.306, Q3_K 0.185).
        let y: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let j = i / 16;
                let v = if j % 5 == 3 { v.abs() } else { *v };
                v * (1 << (j * 3 % 7)) as f32
            })
            .collect();
        let q3_k = rel_rmse(GgmlType::Q3_K, &y, &quantize_q3_k(&y));
        let q2_k = rel_rmse(GgmlType::Q2_K, &y, &quantize_q2_k(&y));
        let iq4_xs = rel_rmse(GgmlType::IQ4_XS, &y, &quantize_iq4_xs(&y));
        eprintln!("spread sub-blocks: q2_k {q2_k:.4} q3_k {q3_k:.4} iq4_xs {iq4_xs:.4}");
        assert!(
            q3_k < 0.25 && q2_k < 0.4 && iq4_xs < 0.12,
            "{q3_k} {q2_k} {iq4_xs}"
        );
        assert!(q4_k < q4_0 && q4_k < q4_1, "q4_k {q4_k}");
        assert!(q5_0 < 0.6 * q4_0, "q5_0 {q5_0}");
        assert!(q5_1 < 0.6 * q4_1, "q5_1 {q5_1}");
        // A fifth bit halves the step: Q5_K below Q4_K's error by about half, and below Q5_1's.
        assert!(q5_k < 0.6 * q4_k && q5_k < q5_1, "q5_k {q5_k}");
        assert!(q6_k < 0.3 * q4_k && q6_k < 0.5 * q5_0, "q6_k {q6_k}");
        // Zeros read back as zeros.
        let z = vec![0f32; 512];
        for (ty, bytes) in [
            (GgmlType::Q2_K, quantize_q2_k(&z)),
            (GgmlType::IQ4_NL, quantize_iq4_nl(&z)),
            (GgmlType::IQ4_XS, quantize_iq4_xs(&z)),
            (GgmlType::Q3_K, quantize_q3_k(&z)),
            (GgmlType::Q4_K, quantize_q4_k(&z)),
            (GgmlType::Q5_K, quantize_q5_k(&z)),
            (GgmlType::Q6_K, quantize_q6_k(&z)),
        ] {
            let mut y = vec![1f32; 512];
            dequantize(ty, &bytes, &mut y);
            assert!(y.iter().all(|&v| v == 0.0), "{ty:?}");
        }
    }
}
