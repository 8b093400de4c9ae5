//! Element-wise kernels (RMSNorm, RoPE, SwiGLU, residual add, argmax/top-k); attention lives in
//! [`super::attention`].

use crate::types::TokenId;

multiversion! {
    /// `out = x / rms(x) · w`, one row at a time (`x.len()` a multiple of `w.len()`).
    pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        let d = w.len();
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let ss = super::quant::dot(xr, xr) / d as f32;
            let s = 1.0 / (ss + eps).sqrt();
            for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
                *o = v * s * g;
            }
        }
    }
}

/// In-place RMSNorm of each `w.len()`-wide chunk (per-head q/k norm).
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for xr in x.chunks_exact_mut(d) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let s = 1.0 / (ss + eps).sqrt();
        for (v, &g) in xr.iter_mut().zip(w) {
            *v = *v * s * g;
        }
    }
}

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (2i, 2i+1): GGML's "normal" rope, used by GGUF Llama files (whose q/k rows the
    /// converter permuted).
    Interleaved,
    /// Pairs (i, i + d/2): HF `rotate_half` / GGML "neox" rope.
    Half,
}

/// Rotates every head of one token in place. `cs` holds `(cos, sin)` for the token's
/// position, one pair per frequency: `head_dim / 2` of them, or fewer for partial rotary
/// embeddings, which rotate the first `2 · cs.len()` dimensions of each head (pairs within
/// them) and leave the rest.
pub fn rope(x: &mut [f32], head_dim: usize, cs: &[(f32, f32)], style: RopeStyle) {
    let half = cs.len().min(head_dim / 2);
    for h in x.chunks_exact_mut(head_dim) {
        for (i, &(c, s)) in cs.iter().enumerate().take(half) {
            let (a, b) = match style {
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                RopeStyle::Half => (i, i + half),
            };
            let (x0, x1) = (h[a], h[b]);
            h[a] = x0 * c - x1 * s;
            h[b] = x0 * s + x1 * c;
        }
    }
}

multiversion! {
    /// `gate = silu(gate) · up`, in place.
    pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
        for (g, &u) in gate.iter_mut().zip(up) {
            *g = *g / (1.0 + fast_exp(-*g)) * u;
        }
    }
}

/// c·tanh(x / c): Gemma's soft-cap of attention scores and of logits.
#[inline(always)]
pub fn softcap(x: f32, c: f32) -> f32 {
    c * (x / c).tanh()
}

multiversion! {
    /// `gate = gelu(gate) · up`, in place, with GELU's tanh approximation written as
    /// x·σ(2y), y = √(2/π)·(x + 0.044715·x³) (the same function: ½(1 + tanh y) = σ(2y)).
    pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
        const C: f32 = 0.797_884_6; // √(2/π)
        for (g, &u) in gate.iter_mut().zip(up) {
            let x = *g;
            let y2 = 2.0 * C * (x + 0.044_715 * x * x * x);
            *g = x / (1.0 + fast_exp(-y2)) * u;
        }
    }
}

multiversion! {
    pub fn add_inplace(x: &mut [f32], y: &[f32]) {
        for (a, &b) in x.iter_mut().zip(y) {
            *a += b;
        }
    }
}

/// Index of the largest value; ties go to the lowest index (deterministic greedy). NaNs are
/// never chosen.
pub fn argmax(x: &[f32]) -> TokenId {
    let m = max_value(x);
    TokenId(x.iter().position(|&v| v == m).unwrap_or(0) as u32)
}

multiversion! {
    /// The largest value (−∞ for an empty slice; NaNs ignored), 16 lanes at a time.
    pub fn max_value(x: &[f32]) -> f32 {
        let mut lanes = [f32::NEG_INFINITY; 16];
        let mut ch = x.chunks_exact(16);
        for c in &mut ch {
            for l in 0..16 {
                // `>` is false for NaN, so a NaN never replaces a lane.
                lanes[l] = if c[l] > lanes[l] { c[l] } else { lanes[l] };
            }
        }
        let mut m = f32::NEG_INFINITY;
        for &v in lanes.iter().chain(ch.remainder()) {
            if v > m {
                m = v;
            }
        }
        m
    }
}

multiversion! {
    /// Appends to `out` the indices `i` with `x[i] >= cut`, in order; 16-wide chunks with no
    /// such value are skipped after one vector comparison.
    pub fn indices_at_least(x: &[f32], cut: f32, out: &mut Vec<u32>) {
        let mut ch = x.chunks_exact(16);
        let mut base = 0u32;
        for c in &mut ch {
            let mut any = false;
            for &v in c {
                any |= v >= cut;
            }
            if any {
                out.extend((0..16u32).filter(|&l| c[l as usize] >= cut).map(|l| base + l));
            }
            base += 16;
        }
        for (l, &v) in ch.remainder().iter().enumerate() {
            if v >= cut {
                out.push(base + l as u32);
            }
        }
    }
}

multiversion! {
    /// ln Σ e^x (−∞ for an empty slice), the exponentials in 16 lanes.
    pub fn log_sum_exp(x: &[f32]) -> f32 {
        let m = max_value(x);
        if m == f32::NEG_INFINITY {
            return m;
        }
        let mut lanes = [0f32; 16];
        let mut ch = x.chunks_exact(16);
        for c in &mut ch {
            for l in 0..16 {
                lanes[l] += fast_exp(c[l] - m);
            }
        }
        let tail: f32 = ch.remainder().iter().map(|&v| fast_exp(v - m)).sum();
        m + (lanes.iter().sum::<f32>() + tail).ln()
    }
}

/// The `k` largest values, descending, ties broken by lower id first.
pub fn top_k(x: &[f32], k: usize) -> Vec<(TokenId, f32)> {
    let k = k.min(x.len());
    if k > 0 && k <= 64 && x.len() > 8 * k {
        return top_k_scan(x, k);
    }
    let mut idx: Vec<u32> = (0..x.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| x[*b as usize].total_cmp(&x[*a as usize]).then(a.cmp(b));
    if k < idx.len() && k > 0 {
        idx.select_nth_unstable_by(k - 1, cmp);
    }
    idx.truncate(k);
    idx.sort_by(cmp);
    idx.into_iter()
        .map(|i| (TokenId(i), x[i as usize]))
        .collect()
}

multiversion! {
    /// [`top_k`] for small k over long rows: one pass keeping the k best in order (a value
    /// enters only when it beats the k-th, so ties keep the lower index, as the sort does).
    fn top_k_scan(x: &[f32], k: usize) -> Vec<(TokenId, f32)> {
        use std::cmp::Ordering::{Greater, Less};
        let mut best: Vec<(TokenId, f32)> = Vec::with_capacity(k + 1);
        let offer = |best: &mut Vec<(TokenId, f32)>, i: usize, v: f32| {
            if best.len() == k && v.total_cmp(&best[k - 1].1) != Greater {
                return;
            }
            let pos = best.partition_point(|b| b.1.total_cmp(&v) != Less);
            best.insert(pos, (TokenId(i as u32), v));
            best.truncate(k);
        };
        let mut ch = x.chunks_exact(16);
        for (c, chunk) in (&mut ch).enumerate() {
            // Once k are kept, a chunk none of whose values beats the k-th is skipped after one
            // vector comparison (NaNs are offered one by one, as total_cmp orders them).
            if best.len() == k {
                let floor = best[k - 1].1;
                let mut hit = false;
                for &v in chunk {
                    hit |= (v > floor) | v.is_nan();
                }
                if !hit {
                    continue;
                }
            }
            for (l, &v) in chunk.iter().enumerate() {
                offer(&mut best, c * 16 + l, v);
            }
        }
        let base = x.len() - ch.remainder().len();
        for (l, &v) in ch.remainder().iter().enumerate() {
            offer(&mut best, base + l, v);
        }
        best
    }
}

/// e^x for f32 without libm, written so that loops over it vectorise: range reduction to
/// x = n·ln2 + r, |r| ≤ ln2/2, a degree-6 polynomial for e^r, and 2^n through the exponent bits.
/// Relative error below 1e-6 on [-87, 88]; inputs below −87 (and −∞) give exactly 0.
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0; // 1.5·2^23: adding it rounds to an integer in the mantissa
    let xc = x.clamp(-87.0, 88.0);
    let k = xc * std::f32::consts::LOG2_E + SHIFT;
    let n = k - SHIFT;
    let r = xc - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (0.166_666_67
                    + r * (0.041_666_668 + r * (0.008_333_334 + r * 0.001_388_888_9)))));
    // n as an integer from k's bits (same exponent as SHIFT, so they differ by n); Rust's
    // saturating `as i32` would not vectorise and costs 4× here.
    let n_int = k.to_bits().wrapping_sub(SHIFT.to_bits());
    let e = p * f32::from_bits(n_int.wrapping_add(127) << 23);
    if x < -87.0 {
        0.0
    } else {
        e
    }
}

/// Natural logarithm of a positive normal float, branch-free so that loops over it vectorise:
/// x = m·2^e with m in [√½, √2), ln m = 2·atanh(s), s = (m − 1)/(m + 1), |s| ≤ 0.172, by its
/// series to s⁹ (relative error below 2e-7; see the test).
#[inline(always)]
pub fn fast_ln(x: f32) -> f32 {
    let bits = x.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 127;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    let big = m > std::f32::consts::SQRT_2;
    m = if big { m * 0.5 } else { m };
    e += big as i32;
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let series = 1.0 + s2 * (1.0 / 3.0 + s2 * (0.2 + s2 * (1.0 / 7.0 + s2 * (1.0 / 9.0))));
    e as f32 * std::f32::consts::LN_2 + 2.0 * s * series
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_ln_is_accurate() {
        let mut worst = 0f64;
        let mut x = 1e-30f32;
        while x < 1e30 {
            let (got, want) = (fast_ln(x) as f64, (x as f64).ln());
            // Absolute error near 1 (where ln → 0), relative elsewhere.
            worst = worst.max((got - want).abs() / want.abs().max(1.0));
            x *= 1.000_37;
        }
        assert!(worst < 2e-7, "max error {worst}");
        // The uniforms of the sampler's noise: (0, 1) on a 2^-23 grid, ends included.
        for u in [0.5f32 / 8_388_608.0, 0.5, 1.0 - 0.5 / 8_388_608.0] {
            let (got, want) = (fast_ln(u) as f64, (u as f64).ln());
            assert!(((got - want) / want).abs() < 1e-6, "{u}: {got} vs {want}");
        }
    }

    #[test]
    fn gelu_tanh_matches_its_definition() {
        let xs: Vec<f32> = (-800..800).map(|i| i as f32 * 0.0123).collect();
        let mut g = xs.clone();
        gelu_tanh_mul(&mut g, &vec![1.0; xs.len()]);
        for (&x, &got) in xs.iter().zip(&g) {
            let x64 = x as f64;
            let y = (2.0 / std::f64::consts::PI).sqrt() * (x64 + 0.044715 * x64.powi(3));
            let want = 0.5 * x64 * (1.0 + y.tanh());
            assert!(
                (got as f64 - want).abs() < 2e-6 * (1.0 + want.abs()),
                "x = {x}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn fast_exp_is_accurate() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (fast_exp(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 1e-6, "max relative error {worst}");
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(-1e30), 0.0);
    }

    #[test]
    fn argmax_ties_go_low() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), TokenId(1));
        // Across 16-lane chunks and in the remainder, against the scalar definition.
        let x: Vec<f32> = (0..100).map(|i| ((i * 37) % 23) as f32).collect();
        let want = (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b });
        assert_eq!(argmax(&x), TokenId(want as u32));
        let mut y = x.clone();
        y[5] = f32::NAN;
        y[97] = 99.0;
        assert_eq!(argmax(&y), TokenId(97));
        assert_eq!(max_value(&[]), f32::NEG_INFINITY);
    }

    #[test]
    fn indices_at_least_matches_filter() {
        let x: Vec<f32> = (0..70).map(|i| ((i * 13) % 31) as f32).collect();
        for cut in [0.0, 20.0, 29.5, 31.0] {
            let mut got = vec![];
            indices_at_least(&x, cut, &mut got);
            let want: Vec<u32> = (0..70).filter(|&i| x[i as usize] >= cut).collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn log_sum_exp_matches_the_definition() {
        for n in [0usize, 1, 15, 16, 17, 1000] {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 8.0).collect();
            let want = x.iter().map(|&v| (v as f64).exp()).sum::<f64>().ln();
            let got = log_sum_exp(&x) as f64;
            if n == 0 {
                assert_eq!(got, f64::NEG_INFINITY);
            } else {
                assert!(
                    (got - want).abs() < 1e-5 * want.abs().max(1.0),
                    "{n}: {got} {want}"
                );
            }
        }
    }

    #[test]
    fn top_k_scan_equals_the_sort() {
        let mut state = 7u32;
        for len in [100, 1000, 1003, 8192] {
            // Coarse values: many ties.
            let mut x: Vec<f32> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    ((state >> 20) % 97) as f32 * 0.25 - 10.0
                })
                .collect();
            if len == 1003 {
                // NaNs (total_cmp puts +NaN first, −NaN last) and infinities, one of each in
                // the 16-wide chunks and in the remainder.
                x[37] = f32::NAN;
                x[1001] = f32::NAN;
                x[500] = -f32::NAN;
                x[998] = f32::INFINITY;
                x[1002] = f32::NEG_INFINITY;
            }
            for k in [1, 3, 15, 25, 64] {
                let mut idx: Vec<u32> = (0..len as u32).collect();
                idx.sort_by(|a, b| x[*b as usize].total_cmp(&x[*a as usize]).then(a.cmp(b)));
                let want: Vec<(TokenId, f32)> = idx[..k]
                    .iter()
                    .map(|&i| (TokenId(i), x[i as usize]))
                    .collect();
                let bits = |v: Vec<(TokenId, f32)>| -> Vec<(TokenId, u32)> {
                    v.into_iter().map(|(t, x)| (t, x.to_bits())).collect()
                };
                assert_eq!(bits(top_k(&x, k)), bits(want), "len {len}, k {k}");
            }
        }
    }

    #[test]
    fn top_k_sorted_with_ties() {
        let t = top_k(&[1.0, 3.0, 3.0, 2.0, 0.5], 3);
        assert_eq!(
            t,
            vec![(TokenId(1), 3.0), (TokenId(2), 3.0), (TokenId(3), 2.0)]
        );
    }

    #[test]
    fn rope_styles_rotate_norm_preserving() {
        let mut a = vec![1.0, 2.0, 3.0, 4.0];
        let cs = [(0.6f32, 0.8f32), (0.0, 1.0)];
        rope(&mut a, 4, &cs, RopeStyle::Half);
        // pair (0,2): (1,3) rotated by (0.6,0.8) → (1·0.6−3·0.8, 1·0.8+3·0.6)
        assert!((a[0] - (0.6 - 2.4)).abs() < 1e-6 && (a[2] - (0.8 + 1.8)).abs() < 1e-6);
        // pair (1,3): (2,4) rotated by 90° → (−4, 2)
        assert!((a[1] + 4.0).abs() < 1e-6 && (a[3] - 2.0).abs() < 1e-6);
    }
}
