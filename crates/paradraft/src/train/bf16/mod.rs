//! Training matmuls with bf16 products on AVX-512 BF16 CPUs (`vdpbf16ps`: 32 multiply-adds
//! per instruction with f32 accumulation, twice f32 FMA's rate). The inputs are rounded to bf16
//! (nearest even) and the sums kept in f32: mixed-precision training's usual arithmetic. The
//! weights, their gradients and the optimiser stay f32.
//!
//! Off by default. [`set_matmul_precision`] turns it on for the calling thread (a training
//! loop builds and differentiates its graph on one thread), like PyTorch's
//! `set_float32_matmul_precision`; [`crate::train::graph::linear`] then uses it on CPUs that
//! have AVX-512 BF16 (`PARADRAFT_ISA` at `avx512`), and is plain f32 elsewhere.

type CResult<T> = candle_core::Result<T>;
use crate::runtime::pool;
use crate::runtime::quant::SendPtr;
use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
use std::cell::Cell;

mod pack;
use pack::{pack_cols, pack_rows};

thread_local! {
    static BF16: Cell<bool> = const { Cell::new(false) };
}

/// The precision of training matmuls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulPrecision {
    /// f32 products (candle's matmul).
    F32,
    /// bf16 products, f32 sums, where the CPU has AVX-512 BF16 (else f32).
    Bf16,
}

/// Sets the precision of the training matmuls that follow on this thread; returns the one
/// it replaces.
pub fn set_matmul_precision(p: MatmulPrecision) -> MatmulPrecision {
    let was = BF16.with(|b| b.replace(p == MatmulPrecision::Bf16));
    if was {
        MatmulPrecision::Bf16
    } else {
        MatmulPrecision::F32
    }
}

/// Whether training matmuls run in bf16 now on this thread: asked for, and the CPU can.
pub fn active() -> bool {
    BF16.with(|b| b.get()) && supported()
}

/// Whether this CPU has the instructions (and `PARADRAFT_ISA` does not hold it below AVX-512).
pub fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::runtime::isa::{isa, Isa};
        isa().has_x86(Isa::Avx512Vnni) && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A matrix of f32 read with strides: element (i, p) at `data[i * rs + p * cs]`.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

/// Rows per tile, and 16-column vectors per tile (the AVX-512 BF16 kernel's).
const MR: usize = 4;
#[cfg(target_arch = "x86_64")]
const NV: usize = 4;

/// `C = A · Bᵀ`: `c[i * n + j] = Σ_p a(i, p) · b(j, p)` with bf16 products and f32 sums, `n`
/// = `b.rows`. `a.cols` must equal `b.cols`. Panics where [`supported`] is false.
pub fn gemm_nt(a: &View, b: &View) -> Vec<f32> {
    assert_eq!(a.cols, b.cols, "inner dimensions");
    assert!(supported(), "bf16 matmul without AVX-512 BF16");
    let (m, n) = (a.rows, b.rows);
    let kp2 = a.cols.div_ceil(2);
    let pa = pack_rows(a, kp2);
    let pb = pack_cols(b, kp2);
    let mut c = vec![0f32; m * n];
    let cp = SendPtr(c.as_mut_ptr());
    let tiles = m.div_ceil(MR);
    pool::par_ranges(tiles, |lo, hi| {
        let (r0, r1) = (lo * MR, (hi * MR).min(m));
        // SAFETY: each range writes only its own rows r0..r1 of `c`.
        let rows = unsafe { std::slice::from_raw_parts_mut(cp.get().add(r0 * n), (r1 - r0) * n) };
        // SAFETY: `supported` checked the CPU's features.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            x86::rows(&pa[r0 * kp2..r1 * kp2], &pb, kp2, n, rows)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (rows, &pa, &pb);
    });
    c
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{MR, NV};
    use std::arch::x86_64::*;

    /// Rows `a` (bf16 pairs, `kp2` per row) times every column block of `b`, into `c`
    /// (`rows × n`).
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn rows(a: &[u32], b: &[u32], kp2: usize, n: usize, c: &mut [f32]) {
        let m = a.len() / kp2.max(1);
        let nb = n.div_ceil(16);
        let mut cb = 0;
        while cb < nb {
            let v = (nb - cb).min(NV);
            let mut i = 0;
            while i < m {
                let r = (m - i).min(MR);
                let (ap, cp) = (&a[i * kp2..], &mut c[i * n..]);
                match (r == MR, v == NV) {
                    (true, true) => tile::<MR, NV>(ap, b, kp2, n, cb, cp),
                    (true, false) => {
                        for x in 0..v {
                            tile::<MR, 1>(ap, b, kp2, n, cb + x, cp);
                        }
                    }
                    (false, true) => {
                        for y in 0..r {
                            tile::<1, NV>(&ap[y * kp2..], b, kp2, n, cb, &mut cp[y * n..]);
                        }
                    }
                    (false, false) => {
                        for y in 0..r {
                            for x in 0..v {
                                let cy = &mut cp[y * n..];
                                tile::<1, 1>(&ap[y * kp2..], b, kp2, n, cb + x, cy);
                            }
                        }
                    }
                }
                i += r;
            }
            cb += v;
        }
    }

    /// An `R × 16V` tile of `c` at column block `cb`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[inline]
    unsafe fn tile<const R: usize, const V: usize>(
        a: &[u32],
        b: &[u32],
        kp2: usize,
        n: usize,
        cb: usize,
        c: &mut [f32],
    ) {
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        let bp = b.as_ptr().add(cb * kp2 * 16);
        let ap = a.as_ptr();
        for q in 0..kp2 {
            // Pairs of bf16 in 32-bit lanes, as `vdpbf16ps` reads them.
            let mut bv: [__m512bh; V] = std::mem::zeroed();
            for (x, v) in bv.iter_mut().enumerate() {
                let raw = _mm512_loadu_si512(bp.add((x * kp2 + q) * 16) as *const _);
                *v = std::mem::transmute::<__m512i, __m512bh>(raw);
            }
            for (y, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_epi32(*ap.add(y * kp2 + q) as i32);
                let av = std::mem::transmute::<__m512i, __m512bh>(av);
                for (x, acc) in row.iter_mut().enumerate() {
                    *acc = _mm512_dpbf16_ps(*acc, av, bv[x]);
                }
            }
        }
        for (y, row) in acc.iter().enumerate() {
            for (x, acc) in row.iter().enumerate() {
                let j0 = (cb + x) * 16;
                let left = n - j0;
                let out = c.as_mut_ptr().add(y * n + j0);
                if left >= 16 {
                    _mm512_storeu_ps(out, *acc);
                } else {
                    _mm512_mask_storeu_ps(out, ((1u32 << left) - 1) as u16, *acc);
                }
            }
        }
    }
}

/// Which product a [`Gemm`] forms from its two inputs.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// `x [m, k]`, `w [n, k]` → `x wᵀ [m, n]` (the layer).
    Forward,
    /// `g [m, n]`, `w [n, k]` → `g w [m, k]` (the input's gradient).
    InputGrad,
    /// `g [m, n]`, `x [m, k]` → `gᵀ x [n, k]` (the weight's gradient).
    WeightGrad,
}

struct Gemm(Kind);

fn slice<'a>(s: &'a CpuStorage, l: &Layout) -> CResult<(&'a [f32], usize, usize)> {
    let (r, c) = match l.dims() {
        &[r, c] => (r, c),
        d => candle_core::bail!("bf16 matmul wants 2-D inputs, got {d:?}"),
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok((&s.as_slice::<f32>()?[a..b], r, c)),
        None => candle_core::bail!("bf16 matmul wants contiguous f32 inputs"),
    }
}

impl CustomOp2 for Gemm {
    fn name(&self) -> &'static str {
        "bf16-matmul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> CResult<(CpuStorage, Shape)> {
        let ((p, pr, pc), (q, qr, qc)) = (slice(s1, l1)?, slice(s2, l2)?);
        let v = |data, rows, cols, rs, cs| View {
            data,
            rows,
            cols,
            rs,
            cs,
        };
        let (a, b) = match self.0 {
            Kind::Forward => (v(p, pr, pc, pc, 1), v(q, qr, qc, qc, 1)),
            Kind::InputGrad => (v(p, pr, pc, pc, 1), v(q, qc, qr, 1, qc)),
            Kind::WeightGrad => (v(p, pc, pr, 1, pc), v(q, qc, qr, 1, qc)),
        };
        if a.cols != b.cols {
            candle_core::bail!("bf16 matmul: shapes {:?} and {:?}", l1.dims(), l2.dims());
        }
        if !supported() {
            candle_core::bail!("bf16 matmul on a CPU without AVX-512 BF16");
        }
        let c = gemm_nt(&a, &b);
        Ok((CpuStorage::F32(c), Shape::from((a.rows, b.rows))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> CResult<(Option<Tensor>, Option<Tensor>)> {
        let g = grad.contiguous()?;
        Ok((
            Some(g.apply_op2_no_bwd(w, &Gemm(Kind::InputGrad))?),
            Some(g.apply_op2_no_bwd(x, &Gemm(Kind::WeightGrad))?),
        ))
    }
}

/// `x wᵀ` for a 2-D `x [m, k]` and `w [n, k]` with bf16 products, with its backward.
pub fn linear(x: &Tensor, w: &Tensor) -> CResult<Tensor> {
    x.contiguous()?
        .apply_op2(&w.contiguous()?, Gemm(Kind::Forward))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Every product against an f64 reference, for shapes that fill no tile exactly, and for
    /// the three strided reads the backward uses: |error| ≤ 2⁻⁷ Σ|a·b| (two bf16 roundings of
    /// relative 2⁻⁹ each per product, f32 sums).
    #[test]
    fn gemm_matches_the_f64_reference() {
        if !supported() {
            eprintln!("no AVX-512 BF16 here: the bf16 kernel is not run");
            return;
        }
        for &(m, n, k) in &[
            (1, 1, 1),
            (5, 17, 3),
            (9, 70, 45),
            (13, 33, 64),
            (4, 64, 576),
        ] {
            let a = rand(m * k, (m * 31 + k) as u64);
            let b = rand(n * k, (n * 17 + k) as u64);
            let at = |i: usize, p: usize| a[i * k + p] as f64;
            let bt = |j: usize, p: usize| b[j * k + p] as f64;
            let check = |c: &[f32], what: &str| {
                for i in 0..m {
                    for j in 0..n {
                        let (mut r, mut s) = (0f64, 0f64);
                        for p in 0..k {
                            r += at(i, p) * bt(j, p);
                            s += (at(i, p) * bt(j, p)).abs();
                        }
                        let e = (c[i * n + j] as f64 - r).abs();
                        assert!(
                            e <= s / 128.0 + 1e-6,
                            "{what} {m}x{n}x{k} ({i},{j}): {e} of {s}"
                        );
                    }
                }
            };
            let va = View {
                data: &a,
                rows: m,
                cols: k,
                rs: k,
                cs: 1,
            };
            let vb = View {
                data: &b,
                rows: n,
                cols: k,
                rs: k,
                cs: 1,
            };
            check(&gemm_nt(&va, &vb), "row-major");
            // The same matrices stored transposed, read with strides.
            let mut a_t = vec![0f32; m * k];
            let mut b_t = vec![0f32; n * k];
            for p in 0..k {
                for i in 0..m {
                    a_t[p * m + i] = a[i * k + p];
                }
                for j in 0..n {
                    b_t[p * n + j] = b[j * k + p];
                }
            }
            let va = View {
                data: &a_t,
                rows: m,
                cols: k,
                rs: 1,
                cs: m,
            };
            let vb = View {
                data: &b_t,
                rows: n,
                cols: k,
                rs: 1,
                cs: n,
            };
            check(&gemm_nt(&va, &vb), "strided");
        }
    }

    /// The layer and both gradients agree with candle's f32 matmul within bf16's precision.
    #[test]
    fn linear_and_its_gradients_match_f32() {
        if !supported() {
            return;
        }
        let dev = Device::Cpu;
        let (m, n, k) = (37, 70, 45);
        let x = Var::from_vec(rand(m * k, 1), (m, k), &dev).unwrap();
        let w = Var::from_vec(rand(n * k, 2), (n, k), &dev).unwrap();
        let g = Tensor::from_vec(rand(m * n, 3), (m, n), &dev).unwrap();
        let run = |bf: bool| {
            let y = if bf {
                linear(x.as_tensor(), w.as_tensor()).unwrap()
            } else {
                x.as_tensor().matmul(&w.as_tensor().t().unwrap()).unwrap()
            };
            let loss = (y.clone() * &g).unwrap().sum_all().unwrap();
            let grads = loss.backward().unwrap();
            let v = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            (
                v(&y),
                v(grads.get(x.as_tensor()).unwrap()),
                v(grads.get(w.as_tensor()).unwrap()),
            )
        };
        let (want, got) = (run(false), run(true));
        for (what, a, b) in [
            ("y", &want.0, &got.0),
            ("dx", &want.1, &got.1),
            ("dw", &want.2, &got.2),
        ] {
            let scale = a.iter().map(|v| v.abs()).fold(0f32, f32::max);
            let worst = a
                .iter()
                .zip(b)
                .map(|(p, q)| (p - q).abs())
                .fold(0f32, f32::max);
            assert!(worst <= 0.02 * scale, "{what}: {worst} of {scale}");
            assert!(worst > 0.0, "{what}: identical to f32, so not bf16");
        }
    }
}

#[cfg(test)]
mod speed {
    use super::*;
    /// `cargo test --release -p paradraft --lib bf16_speed -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn bf16_speed() {
        let dev = candle_core::Device::Cpu;
        for &(m, n, k) in &[(2000, 8192, 576), (2000, 1536, 576), (3200, 576, 1152)] {
            let x = Tensor::rand(-1f32, 1., (m, k), &dev).unwrap();
            let w = Tensor::rand(-1f32, 1., (n, k), &dev).unwrap();
            let t = std::time::Instant::now();
            for _ in 0..3 {
                let _ = x.matmul(&w.t().unwrap()).unwrap();
            }
            let f = t.elapsed().as_secs_f64() / 3.0;
            let xs = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let ws = w.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let (va, vb) = (
                View {
                    data: &xs,
                    rows: m,
                    cols: k,
                    rs: k,
                    cs: 1,
                },
                View {
                    data: &ws,
                    rows: n,
                    cols: k,
                    rs: k,
                    cs: 1,
                },
            );
            let kp2 = k.div_ceil(2);
            let t = std::time::Instant::now();
            let pa = pack_rows(&va, kp2);
            let pb = pack_cols(&vb, kp2);
            let pack = t.elapsed().as_secs_f64();
            let t = std::time::Instant::now();
            for _ in 0..3 {
                let _ = gemm_nt(&va, &vb);
            }
            let b = t.elapsed().as_secs_f64() / 3.0;
            let g = (m * n * k) as f64 / 1e9;
            eprintln!(
                "{m}x{n}x{k}: f32 {:.1} ms ({:.0} GMAC/s), bf16 {:.1} ms ({:.0} GMAC/s) of which packing {:.1} ms ({} {})",
                f * 1e3, g / f, b * 1e3, g / b, pack * 1e3, pa.len(), pb.len()
            );
        }
    }
}
