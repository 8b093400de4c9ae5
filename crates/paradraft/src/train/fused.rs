//! Fused training ops with hand-written backward passes, shared by the drafter trainers:
//! RMSNorm, the softmax over per-row column ranges (DFlash's anchor blocks, DART's prefix-shared
//! blocks), and cross-entropy plus KL
//! over a draft vocabulary's logits. Each replaces a chain
//! of candle primitives (one tensor allocation and one memory pass per primitive, forward and
//! backward) by one pass each way. candle's own fused `rms_norm` and `softmax_last_dim`
//! record no backward; these do, and `tests` checks them against the composed primitives.

use crate::runtime::ops::{fast_exp, max_value};
use crate::runtime::quant::par_rows;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};
use std::sync::Mutex;

type CResult<T> = candle_core::Result<T>;

fn slice<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> CResult<&'a [f32]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&s.as_slice::<f32>()?[a..b]),
        None => candle_core::bail!("{what} wants a contiguous f32 input"),
    }
}

fn contiguous_f32(t: &Tensor) -> CResult<Vec<f32>> {
    t.contiguous()?.flatten_all()?.to_vec1::<f32>()
}

/// `x · w / sqrt(mean(x²) + eps)` over the last dimension, with its backward. Off the CPU it
/// is composed from candle primitives (which have backward passes on every device).
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> CResult<Tensor> {
    if !x.device().is_cpu() {
        return composed_rms_norm(x, w, eps);
    }
    x.contiguous()?.apply_op2(w, RmsNorm { eps: eps as f32 })
}

fn composed_rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> CResult<Tensor> {
    let ms = x.sqr()?.mean_keepdim(candle_core::D::Minus1)?;
    x.broadcast_mul(&(ms + eps)?.sqrt()?.recip()?)?
        .broadcast_mul(w)
}

struct RmsNorm {
    eps: f32,
}

fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    1.0 / (ss / x.len() as f32 + eps).sqrt()
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "fused-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> CResult<(CpuStorage, Shape)> {
        let (x, w) = (slice(s1, l1, "rms-norm")?, slice(s2, l2, "rms-norm")?);
        let n = w.len();
        if n == 0 || l1.dims().last() != Some(&n) {
            candle_core::bail!("rms-norm: weight of {n} for input {:?}", l1.dims());
        }
        let mut y = vec![0f32; x.len()];
        par_rows(&mut y, n, |r, out| {
            for (i, o) in r.zip(out.chunks_exact_mut(n)) {
                let xr = &x[i * n..(i + 1) * n];
                let s = inv_rms(xr, self.eps);
                for ((o, &a), &b) in o.iter_mut().zip(xr).zip(w) {
                    *o = a * s * b;
                }
            }
        });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> CResult<(Option<Tensor>, Option<Tensor>)> {
        let (xv, wv, gv) = (
            contiguous_f32(x)?,
            contiguous_f32(w)?,
            contiguous_f32(grad)?,
        );
        let n = wv.len();
        let mut dx = vec![0f32; xv.len()];
        // Each range's partial dw, summed in range order afterwards: the ranges are fixed but
        // finish in any order, and adding them as they finish made dw (and a resumed run)
        // differ from run to run in the last bits.
        let parts = Mutex::new(Vec::<(usize, Vec<f32>)>::new());
        // dx = s·(g⊙w) − x·s³·mean((g⊙w)⊙x);  dw = Σ_rows g⊙x·s.
        par_rows(&mut dx, n, |r, out| {
            let (first, mut local) = (r.start, vec![0f32; n]);
            for (i, o) in r.zip(out.chunks_exact_mut(n)) {
                let (xr, gr) = (&xv[i * n..(i + 1) * n], &gv[i * n..(i + 1) * n]);
                let s = inv_rms(xr, self.eps);
                let dot: f32 = xr
                    .iter()
                    .zip(gr)
                    .zip(&wv)
                    .map(|((a, g), b)| a * g * b)
                    .sum();
                let c = s * s * s * dot / n as f32;
                for j in 0..n {
                    o[j] = s * gr[j] * wv[j] - xr[j] * c;
                    local[j] += gr[j] * xr[j] * s;
                }
            }
            let mut parts = parts.lock().unwrap_or_else(|e| e.into_inner());
            parts.push((first, local));
        });
        let mut parts = parts.into_inner().unwrap_or_else(|e| e.into_inner());
        parts.sort_unstable_by_key(|p| p.0);
        let mut dw = vec![0f32; n];
        for (_, local) in &parts {
            dw.iter_mut().zip(local).for_each(|(a, b)| *a += b);
        }
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), x.device())?),
            Some(Tensor::from_vec(dw, w.shape(), w.device())?),
        ))
    }
}

/// Softmax over the last dimension of DFlash block-attention scores `[heads, blocks, B, S + B]`
/// (S context slots, then the block's own B slots): row `(h, j, r)` sees context slots
/// `0..visible[j]` and every slot of its block; the rest get probability 0. With its backward.
pub fn block_softmax(scores: &Tensor, visible: &[usize]) -> CResult<Tensor> {
    let (_, nb, b, w) = scores.dims4()?;
    if visible.len() != nb || visible.iter().any(|&v| v + b > w) {
        candle_core::bail!(
            "block-softmax: {} visible counts for {nb} blocks",
            visible.len()
        );
    }
    let s = (w - b) as u32;
    let ranges: Vec<Ranges> = visible
        .iter()
        .flat_map(|&v| std::iter::repeat_n([(0, v as u32), (s, w as u32)], b))
        .collect();
    range_softmax(scores, &ranges)
}

/// The visible columns of one attention row: two half-open ranges (either may be empty).
pub type Ranges = [(u32, u32); 2];

/// Softmax over the last dimension where row `i` (counting rows of all leading dimensions)
/// sees only the columns of `ranges[i % ranges.len()]`; the rest get probability 0. Every
/// row must see at least one column. With its backward; off the CPU it is composed from
/// primitives with an additive mask.
pub fn range_softmax(scores: &Tensor, ranges: &[Ranges]) -> CResult<Tensor> {
    let w = scores.dim(candle_core::D::Minus1)? as u32;
    let rows = scores.elem_count() / w.max(1) as usize;
    if ranges.is_empty()
        || !rows.is_multiple_of(ranges.len())
        || ranges
            .iter()
            .any(|r| r.iter().any(|&(a, b)| a > b || b > w) || r[0].0 == r[0].1 && r[1].0 == r[1].1)
    {
        candle_core::bail!(
            "range-softmax: {} row ranges for {rows} rows of {w}",
            ranges.len()
        );
    }
    if !scores.device().is_cpu() {
        return composed_range_softmax(scores, ranges);
    }
    scores.contiguous()?.apply_op1(RangeSoftmax {
        ranges: ranges.to_vec(),
    })
}

/// An additive mask and the composed softmax (primitives with backward on every device).
fn composed_range_softmax(scores: &Tensor, ranges: &[Ranges]) -> CResult<Tensor> {
    let w = scores.dim(candle_core::D::Minus1)?;
    let mut mask = vec![-1e9f32; ranges.len() * w];
    for (i, r) in ranges.iter().enumerate() {
        for &(a, b) in r {
            mask[i * w + a as usize..i * w + b as usize].fill(0.0);
        }
    }
    let rows = scores.elem_count() / w;
    let mask = Tensor::from_vec(mask, (ranges.len(), w), scores.device())?;
    let x = scores
        .reshape((rows / ranges.len(), ranges.len(), w))?
        .broadcast_add(&mask)?;
    let m = x.max_keepdim(candle_core::D::Minus1)?.detach();
    let e = x.broadcast_sub(&m)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(candle_core::D::Minus1)?)?
        .reshape(scores.shape())
}

struct RangeSoftmax {
    ranges: Vec<Ranges>,
}

impl RangeSoftmax {
    fn cols(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        let [(a, b), (c, d)] = self.ranges[i % self.ranges.len()];
        (a as usize..b as usize).chain(c as usize..d as usize)
    }
}

impl CustomOp1 for RangeSoftmax {
    fn name(&self) -> &'static str {
        "range-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> CResult<(CpuStorage, Shape)> {
        let x = slice(s, l, "range-softmax")?;
        let w = *l.dims().last().unwrap_or(&1);
        let mut p = vec![0f32; x.len()];
        par_rows(&mut p, w, |r, out| {
            for (i, o) in r.zip(out.chunks_exact_mut(w)) {
                let xr = &x[i * w..(i + 1) * w];
                let m = self.cols(i).fold(f32::NEG_INFINITY, |a, c| a.max(xr[c]));
                let mut sum = 0.0;
                for c in self.cols(i) {
                    let e = fast_exp(xr[c] - m);
                    o[c] = e;
                    sum += e;
                }
                let inv = 1.0 / sum;
                for c in self.cols(i) {
                    o[c] *= inv;
                }
            }
        });
        Ok((CpuStorage::F32(p), l.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, res: &Tensor, grad: &Tensor) -> CResult<Option<Tensor>> {
        // dx = p ⊙ (g − Σ p⊙g); masked entries have p = 0.
        let (p, g) = (contiguous_f32(res)?, contiguous_f32(grad)?);
        let w = arg.dim(candle_core::D::Minus1)?;
        let mut dx = vec![0f32; p.len()];
        par_rows(&mut dx, w, |r, out| {
            for (i, o) in r.zip(out.chunks_exact_mut(w)) {
                let (pr, gr) = (&p[i * w..(i + 1) * w], &g[i * w..(i + 1) * w]);
                let dot: f32 = self.cols(i).map(|c| pr[c] * gr[c]).sum();
                for c in self.cols(i) {
                    o[c] = pr[c] * (gr[c] - dot);
                }
            }
        });
        Ok(Some(Tensor::from_vec(dx, arg.shape(), arg.device())?))
    }
}

/// Per-row loss over logits `[R, V]`: the cross-entropy of `labels[r]`, plus `kl` × KL(p‖q)
/// where q = softmax(logits) and p = softmax(`target[r]`) (no gradient into the target), with
/// its backward `g·((q − onehot) + kl·(q − p))`. Off the CPU it is composed from primitives.
pub fn cross_entropy_kl(
    logits: &Tensor,
    labels: &[u32],
    target: Option<&Tensor>,
    kl: f64,
) -> CResult<Tensor> {
    let (r, v) = logits.dims2()?;
    if labels.len() != r || labels.iter().any(|&l| l as usize >= v) {
        candle_core::bail!("cross-entropy: {} labels for {r} rows of {v}", labels.len());
    }
    let target = target.filter(|_| kl > 0.0);
    if !logits.device().is_cpu() {
        return composed_ce_kl(logits, labels, target, kl);
    }
    let op = CeKl {
        labels: labels.to_vec(),
        kl: kl as f32,
    };
    match target {
        Some(t) => logits
            .contiguous()?
            .apply_op2(&t.detach().contiguous()?, op),
        None => {
            // The target argument is ignored when kl is 0; pass the logits themselves.
            let l = logits.contiguous()?;
            l.apply_op2(&l.detach(), CeKl { kl: 0.0, ..op })
        }
    }
}

fn composed_ce_kl(
    logits: &Tensor,
    labels: &[u32],
    target: Option<&Tensor>,
    kl: f64,
) -> CResult<Tensor> {
    use candle_core::D;
    let m = logits.max_keepdim(D::Minus1)?.detach();
    let lse = (logits
        .broadcast_sub(&m)?
        .exp()?
        .sum_keepdim(D::Minus1)?
        .log()?
        + &m)?;
    let lab = Tensor::from_vec(labels.to_vec(), (labels.len(), 1), logits.device())?;
    let mut out = (&lse - logits.gather(&lab, 1)?)?.squeeze(1)?;
    if let Some(t) = target {
        let t = t.detach();
        let tls = t.broadcast_sub(&t.max_keepdim(D::Minus1)?)?;
        let logp = tls.broadcast_sub(&tls.exp()?.sum_keepdim(D::Minus1)?.log()?)?;
        let logq = logits.broadcast_sub(&lse)?;
        let k = (logp.exp()? * (logp - logq)?)?.sum(D::Minus1)?;
        out = (out + (k * kl)?)?;
    }
    Ok(out)
}

struct CeKl {
    labels: Vec<u32>,
    kl: f32,
}

/// Log-sum-exp of a row.
fn lse(x: &[f32]) -> f32 {
    let m = max_value(x);
    m + lanes_sum(x, |v| fast_exp(v - m)).ln()
}

/// Σ f(xᵢ) in 16 partial sums (so that the loop vectorises), then the remainder.
#[inline(always)]
fn lanes_sum(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; 16];
    let mut ch = x.chunks_exact(16);
    for c in &mut ch {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    acc.iter().sum::<f32>() + ch.remainder().iter().map(|&v| f(v)).sum::<f32>()
}

impl CustomOp2 for CeKl {
    fn name(&self) -> &'static str {
        "cross-entropy-kl"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> CResult<(CpuStorage, Shape)> {
        let (x, t) = (
            slice(s1, l1, "cross-entropy")?,
            slice(s2, l2, "cross-entropy")?,
        );
        let v = *l1.dims().last().unwrap_or(&1);
        let r = self.labels.len();
        let mut out = vec![0f32; r];
        par_rows(&mut out, 1, |rows, o| {
            for (i, o) in rows.zip(o.iter_mut()) {
                let xr = &x[i * v..(i + 1) * v];
                let lx = lse(xr);
                let mut loss = lx - xr[self.labels[i] as usize];
                if self.kl > 0.0 {
                    let tr = &t[i * v..(i + 1) * v];
                    let lt = lse(tr);
                    // Σ p·(log p − log q) = Σ p·(t − x) − lt + lx, since Σ p = 1.
                    let mut acc = [0f32; 16];
                    let (mut tc, mut xc) = (tr.chunks_exact(16), xr.chunks_exact(16));
                    for (a16, b16) in (&mut tc).zip(&mut xc) {
                        for ((s, &a), &b) in acc.iter_mut().zip(a16).zip(b16) {
                            *s += fast_exp(a - lt) * (a - b);
                        }
                    }
                    let tail: f32 = (tc.remainder().iter().zip(xc.remainder()))
                        .map(|(&a, &b)| fast_exp(a - lt) * (a - b))
                        .sum();
                    let k = acc.iter().sum::<f32>() + tail - lt + lx;
                    loss += self.kl * k;
                }
                *o = loss;
            }
        });
        Ok((CpuStorage::F32(out), Shape::from(r)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        t: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> CResult<(Option<Tensor>, Option<Tensor>)> {
        let (xv, g) = (contiguous_f32(x)?, contiguous_f32(grad)?);
        let tv = if self.kl > 0.0 {
            contiguous_f32(t)?
        } else {
            vec![]
        };
        let v = x.dim(1)?;
        let mut dx = vec![0f32; xv.len()];
        par_rows(&mut dx, v, |rows, out| {
            for (i, o) in rows.zip(out.chunks_exact_mut(v)) {
                let xr = &xv[i * v..(i + 1) * v];
                let lx = lse(xr);
                // (1 + kl)·q − onehot − kl·p, scaled by the row's upstream gradient.
                let c = 1.0 + self.kl;
                for (a, &b) in o.iter_mut().zip(xr) {
                    *a = c * fast_exp(b - lx);
                }
                if self.kl > 0.0 {
                    let tr = &tv[i * v..(i + 1) * v];
                    let lt = lse(tr);
                    for (a, &b) in o.iter_mut().zip(tr) {
                        *a -= self.kl * fast_exp(b - lt);
                    }
                }
                o[self.labels[i] as usize] -= 1.0;
                o.iter_mut().for_each(|a| *a *= g[i]);
            }
        });
        Ok((Some(Tensor::from_vec(dx, x.shape(), x.device())?), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn randn(shape: &[usize], seed: u64) -> Tensor {
        Tensor::randn(0f32, 1.0, shape, &Device::Cpu)
            .unwrap()
            .affine(1.0, (seed % 7) as f64 * 0.1)
            .unwrap()
    }

    fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
        let (a, b) = (contiguous_f32(a).unwrap(), contiguous_f32(b).unwrap());
        let scale = b.iter().fold(1e-3f32, |m, x| m.max(x.abs()));
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
            / scale
    }

    /// The fused op's output and the gradients of `vars` (under a random upstream gradient)
    /// equal those of the composed primitives (the fallback off the CPU), to `tol` of the
    /// largest value.
    fn assert_matches(fused: Tensor, composed: Tensor, vars: &[&Var], tol: f32) {
        let d = max_rel(&fused, &composed);
        assert!(d < tol, "forward {d}");
        let up = randn(fused.dims(), 9);
        let grads = |t: Tensor| (t * &up).unwrap().sum_all().unwrap().backward().unwrap();
        let (gf, gc) = (grads(fused), grads(composed));
        for v in vars {
            let (a, b) = (
                gf.get(v.as_tensor()).unwrap(),
                gc.get(v.as_tensor()).unwrap(),
            );
            assert!(max_rel(a, b) < tol, "gradient {}", max_rel(a, b));
        }
    }

    #[test]
    fn rms_norm_matches_the_composed_ops() {
        let x = Var::from_tensor(&randn(&[37, 64], 1)).unwrap();
        let w = Var::from_tensor(&randn(&[64], 2)).unwrap();
        let (xt, wt) = (x.as_tensor(), w.as_tensor());
        let f = rms_norm(xt, wt, 1e-6).unwrap();
        assert_matches(f, composed_rms_norm(xt, wt, 1e-6).unwrap(), &[&x, &w], 1e-5);
    }

    /// The weight gradient sums the rows' partials in a fixed order, so repeated backward passes
    /// agree to the bit however the pool's ranges finish (a resumed run depends on it).
    #[test]
    fn rms_norm_weight_gradient_is_the_same_every_time() {
        let x = Var::from_tensor(&randn(&[257, 48], 11)).unwrap();
        let w = Var::from_tensor(&randn(&[48], 12)).unwrap();
        let dw = || {
            let y = rms_norm(x.as_tensor(), w.as_tensor(), 1e-5).unwrap();
            let g = y.sqr().unwrap().sum_all().unwrap().backward().unwrap();
            let v = g.get(w.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
            v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>()
        };
        let first = dw();
        for _ in 0..200 {
            assert_eq!(dw(), first);
        }
    }

    /// With and without the KL term.
    #[test]
    fn cross_entropy_kl_matches_the_composed_ops() {
        let x = Var::from_tensor(&randn(&[9, 50], 6)).unwrap();
        let t = randn(&[9, 50], 7);
        let labels: Vec<u32> = (0..9).map(|i| (i * 7 % 50) as u32).collect();
        for kl in [0.0, 0.7] {
            let f = cross_entropy_kl(x.as_tensor(), &labels, Some(&t), kl).unwrap();
            let c = composed_ce_kl(x.as_tensor(), &labels, (kl > 0.0).then_some(&t), kl).unwrap();
            assert_matches(f, c, &[&x], 1e-5);
        }
    }

    /// Masked entries are exactly 0 (and so get no gradient); the composed reference is an
    /// additive mask built independently of the fused op's indexing.
    #[test]
    fn block_softmax_matches_the_masked_composed_ops() {
        let (h, nb, b, s) = (3, 4, 5, 11);
        let visible = [0usize, 3, 11, 7];
        let x = Var::from_tensor(&randn(&[h, nb, b, s + b], 4)).unwrap();
        let f = block_softmax(x.as_tensor(), &visible).unwrap();
        let p = contiguous_f32(&f).unwrap();
        assert_eq!(p[s - 1], 0.0, "block 0 sees no context");
        assert_eq!(
            p[(b + 1) * (s + b) + 3],
            0.0,
            "block 1 sees 3 context slots"
        );
        assert!(p[(b + 1) * (s + b) + 2] > 0.0);
        let ranges: Vec<Ranges> = visible
            .iter()
            .flat_map(|&v| std::iter::repeat_n([(0, v as u32), (s as u32, (s + b) as u32)], b))
            .collect();
        let c = composed_range_softmax(x.as_tensor(), &ranges).unwrap();
        assert_matches(f, c, &[&x], 1e-5);
    }

    /// DART's prefix-shared rows: causal clean rows, then mask rows seeing a clean prefix and
    /// their own block causally.
    #[test]
    fn range_softmax_matches_the_masked_composed_ops() {
        let (h, n) = (2, 9);
        let ranges: Vec<Ranges> = vec![
            [(0, 1), (0, 0)],
            [(0, 2), (0, 0)],
            [(0, 3), (0, 0)],
            [(0, 4), (0, 0)],
            [(0, 2), (4, 5)],
            [(0, 2), (4, 6)],
            [(0, 2), (4, 7)],
            [(0, 0), (7, 8)],
            [(0, 4), (7, 9)],
        ];
        let x = Var::from_tensor(&randn(&[h, n, n], 9)).unwrap();
        let f = range_softmax(x.as_tensor(), &ranges).unwrap();
        let p = contiguous_f32(&f).unwrap();
        assert_eq!(p[2], 0.0, "row 0 sees column 0 only");
        assert!((p[0] - 1.0).abs() < 1e-6);
        assert_eq!(p[5 * n + 2], 0.0, "row 5 skips clean column 2");
        let c = composed_range_softmax(x.as_tensor(), &ranges).unwrap();
        assert_matches(f, c, &[&x], 1e-5);
        assert!(range_softmax(x.as_tensor(), &[[(0, 0), (3, 3)]]).is_err());
        assert!(range_softmax(x.as_tensor(), &[[(0, 10), (0, 0)]]).is_err());
    }
}
