//! Quantized matmul for few activation rows (decode, verification, prefill tiles).
//! Kernels: AVX-512 VNNI, 256-bit VNNI and AVX2 on x86-64, NEON with `sdot` on AArch64, and a
//! portable scalar one that every other kernel is tested against.
//!
//! Weights (every quantized GGML type, in the formats of `pack.rs`) are repacked at load into
//! groups of 16 output rows so that one 512-bit register holds 4 consecutive weights of each of
//! the 16 rows: a VNNI `dpbusd` against a broadcast of 4 activation bytes then yields 16 rows'
//! partial dots with no horizontal reduction, and each weight register is unpacked once for all
//! activation rows.
//! Activations are quantized to int8 per 32-block (scale `d`, and `s = d · Σq` for the Q4 min
//! term), as GGML's Q8 activations are.
//!
//! Per (row group g, block b), 16 rows r, 32 inputs:
//! - Q4 (Q4_0 as Q4_1 with m = −8d): `chunk[i][4r + j] = qs_r[4i + j]` for i in 0..4, whose low
//!   nibbles are inputs 4i..4i+4 and high nibbles inputs 16+4i..16+4i+4; `d[r]`, `m[r]` as f16.
//!   Σ w·x = d_w·d_x·Σ q·y + m_w·s_x.
//! - Q8: `chunk[i][4r + j] = w_r[4i + j]` for i in 0..8; `d[r]` f16; `wsum[r] = Σ w_r` i16.
//!   The unsigned operand is the activation shifted by 128: Σ (y+128)·w − 128·Σ w = Σ y·w.

use super::ggml::{GgmlType, QK};
use super::isa::{isa, Isa};

mod buf;
mod pack;

/// Calls `$tile!(name, consts…)` with the tile function and const parameters of `fmt`'s
/// format — `q4_tile::<…, S, FIVE>`, `q6_tile::<…, W, OFF, MIN>`, `q4t_tile::<…>` or `q8_tile::<…, S, HALVES, MIN>` — in every ISA's kernel
/// (each defines its own `$tile` macro for its tile heights).
macro_rules! by_format {
    ($fmt:expr, $tile:ident) => {
        match $fmt {
            Fmt::Q4 => $tile!(q4_tile, false, false),
            Fmt::Q4S => $tile!(q4_tile, true, false),
            Fmt::Q5S => $tile!(q4_tile, true, true),
            Fmt::Q6S => $tile!(q6_tile, 6, 32, false),
            Fmt::Q3S => $tile!(q6_tile, 3, 4, false),
            Fmt::Q2S => $tile!(q6_tile, 2, 0, true),
            Fmt::Q4T => $tile!(q4t_tile),
            Fmt::Q8 => $tile!(q8_tile, false, false, false),
            Fmt::Q8S { halves, min } => match (halves, min) {
                (false, false) => $tile!(q8_tile, true, false, false),
                (false, true) => $tile!(q8_tile, true, false, true),
                (true, false) => $tile!(q8_tile, true, true, false),
                (true, true) => $tile!(q8_tile, true, true, true),
            },
        }
    };
}
pub use pack::{Fmt, Packed};

pub const GROUP: usize = 16;

/// Int8 activations, one scale per 32-block.
#[derive(Default, Clone, Debug)]
pub struct QActs {
    pub n: usize,
    pub k: usize,
    /// `n × k` signed values.
    pub qs: Vec<i8>,
    /// `n × k` values + 128 (the unsigned form for Q8 weights).
    pub us: Vec<u8>,
    /// `n × k/32` scales.
    pub d: Vec<f32>,
    /// `n × k/32`: `d · Σ q` over the block.
    pub s: Vec<f32>,
    /// `n × k/16`: `d · Σ q` over each half of the block (for weights with a min per 16).
    pub h: Vec<f32>,
    /// `n × k/16`: `Σ q` over each half of the block (the integer offset of `Q6S` levels).
    pub hs: Vec<i16>,
    /// Whether `h` and `hs` hold this quantization's sums (only formats with a sub-scale per
    /// 16 inputs read them: [`Fmt::half_sums`]).
    pub halves: bool,
}

impl QActs {
    /// Marks the buffer empty: matmuls then use f32 activations.
    pub fn clear(&mut self) {
        self.n = 0;
    }

    /// Quantizes the `x.len() / k` rows of `x`; rows are split across the pool when there are
    /// enough of them (the result does not depend on the split).
    pub fn quantize(&mut self, x: &[f32], k: usize) {
        self.quantize_with(x, k, true)
    }

    /// [`QActs::quantize`], the sums per 16 inputs only when `halves` (a serial pass over
    /// every value that only weights with a sub-scale per 16 read).
    pub fn quantize_with(&mut self, x: &[f32], k: usize, halves: bool) {
        assert!(k.is_multiple_of(QK) && x.len().is_multiple_of(k));
        let n = x.len() / k;
        let nb = k / QK;
        self.n = n;
        self.k = k;
        self.qs.resize(n * k, 0);
        self.us.resize(n * k, 0);
        self.d.resize(n * nb, 0.0);
        self.s.resize(n * nb, 0.0);
        let kern = isa();
        let out = BlockOut::of(self);
        let run = |t0: usize, t1: usize| {
            let xs = &x[t0 * k..t1 * k];
            let o = out.at(t0 * nb);
            // SAFETY: rows t0..t1 own blocks t0·nb..t1·nb of every output array.
            unsafe { quantize_blocks(kern, xs, o) }
        };
        if n >= super::pool::PAR_ROWS {
            super::pool::par_ranges(n, run);
        } else {
            run(0, n);
        }
        self.halves = halves;
        if halves {
            self.half_sums(n * k);
        }
    }

    /// Fills `hs` and `h` from `qs` and `d` (exact integer sums, then one product per half).
    fn half_sums(&mut self, len: usize) {
        let nb = len / QK;
        self.h.resize(2 * nb, 0.0);
        self.hs.resize(2 * nb, 0);
        let halves = self.h.iter_mut().zip(self.hs.iter_mut());
        for (i, ((h, hs), q)) in halves.zip(self.qs.chunks_exact(16)).enumerate() {
            let sum: i32 = q.iter().map(|&v| v as i32).sum();
            *hs = sum as i16; // |Σ| ≤ 16 · 127
            *h = self.d[i / 2] * sum as f32;
        }
    }

    /// Scalar quantization of all rows (the reference for the SIMD version; same rounding).
    /// The buffers must already be sized (as [`QActs::quantize`] does).
    pub fn quantize_portable(&mut self, x: &[f32]) {
        let out = BlockOut::of(self);
        assert!(self.qs.len() >= x.len() && self.d.len() >= x.len() / QK);
        // SAFETY: sizes checked above.
        unsafe { quantize_blocks_portable(x, out) }
        self.half_sums(x.len());
        self.halves = true;
    }
}

/// Where quantized blocks go: `qs`/`us` 32 bytes and `d`/`s` one value per block, from block 0.
#[derive(Clone, Copy)]
struct BlockOut {
    qs: *mut i8,
    us: *mut u8,
    d: *mut f32,
    s: *mut f32,
}
// SAFETY: tasks write disjoint block ranges.
unsafe impl Sync for BlockOut {}
unsafe impl Send for BlockOut {}

impl BlockOut {
    /// Block 0 of `a`'s buffers (which the caller has sized).
    fn of(a: &mut QActs) -> BlockOut {
        BlockOut {
            qs: a.qs.as_mut_ptr(),
            us: a.us.as_mut_ptr(),
            d: a.d.as_mut_ptr(),
            s: a.s.as_mut_ptr(),
        }
    }

    /// The same arrays from block `b` on.
    fn at(self, b: usize) -> BlockOut {
        BlockOut {
            qs: self.qs.wrapping_add(b * QK),
            us: self.us.wrapping_add(b * QK),
            d: self.d.wrapping_add(b),
            s: self.s.wrapping_add(b),
        }
    }
}

/// [`quantize_blocks_portable`] with the kernel of `kern` (each gives the same bits).
///
/// # Safety
/// `o` must be valid for `x.len() / 32` blocks, and the CPU must support `kern`.
unsafe fn quantize_blocks(kern: Isa, x: &[f32], o: BlockOut) {
    match kern {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni | Isa::Amx => avx512::quantize(x, o),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni => avx2::quantize(x, o),
        #[cfg(target_arch = "aarch64")]
        Isa::NeonDot => neon::quantize(x, o),
        _ => quantize_blocks_portable(x, o),
    }
}

/// Per 32-block: scale = amax / 127, round to nearest even, saturate to ±127.
///
/// # Safety
/// `o` must be valid for `x.len() / 32` blocks.
unsafe fn quantize_blocks_portable(x: &[f32], o: BlockOut) {
    for (bi, xb) in x.chunks_exact(QK).enumerate() {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (j, &xv) in xb.iter().enumerate() {
            // Round to nearest (ties to even) without a libm call: adding 1.5·2^23 pushes
            // the fraction out of the f32 mantissa. |xv·id| ≤ 127 here.
            const MAGIC: f32 = 12_582_912.0;
            let q = ((xv * id + MAGIC) - MAGIC) as i8;
            *o.qs.add(bi * QK + j) = q;
            *o.us.add(bi * QK + j) = (q as u8) ^ 0x80;
            sum += q as i32;
        }
        *o.d.add(bi) = d;
        *o.s.add(bi) = d * sum as f32;
    }
}

impl Packed {
    /// `out[t, r] = Σ_i W[r, i] · x_t[i]` for row groups `g0..g1`, written to
    /// `out[t * ld + r]`, using the fastest kernel the CPU supports.
    ///
    /// # Safety
    /// `out` must be valid for writes at `t * ld + r` for every `t < a.n` and every row `r` of
    /// the groups, and no other thread may write those elements meanwhile.
    pub unsafe fn matmul_groups(&self, a: &QActs, g0: usize, g1: usize, out: *mut f32, ld: usize) {
        self.matmul_groups_with(isa(), a, g0, g1, out, ld)
    }

    /// [`Packed::matmul_groups`] with the kernel of `kern`.
    ///
    /// # Safety
    /// As for [`Packed::matmul_groups`], and the CPU must support `kern`.
    unsafe fn matmul_groups_with(
        &self,
        kern: Isa,
        a: &QActs,
        g0: usize,
        g1: usize,
        out: *mut f32,
        ld: usize,
    ) {
        debug_assert_eq!(a.k, self.cols);
        match kern {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => avx512::matmul_groups(self, a, g0, g1, out, ld),
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => amx::matmul_groups(self, a, g0, g1, out, ld),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::matmul_groups(self, a, g0, g1, out, ld),
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni if super::isa::vnni_evex() => {
                avx2::matmul_groups_vnni_evex(self, a, g0, g1, out, ld)
            }
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => avx2::matmul_groups_vnni_vex(self, a, g0, g1, out, ld),
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDot => neon::matmul_groups(self, a, g0, g1, out, ld),
            _ => self.matmul_groups_portable(a, g0, g1, out, ld),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(target_arch = "x86_64")]
mod amx;

#[cfg(target_arch = "aarch64")]
mod neon;

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::runtime::quant::dequantize;
    use half::f16;

    /// A small deterministic generator for test data.
    pub(in crate::runtime) struct Lcg(pub(in crate::runtime) u64);
    impl Lcg {
        fn next(&mut self) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) as u32
        }
        /// Uniform in [0, 1).
        pub(in crate::runtime) fn unif(&mut self) -> f32 {
            self.next() as f32 / (1u64 << 31) as f32
        }
    }

    /// Byte offsets of the f16 fields (scales, mins) in a block of `ty`.
    fn f16_fields(ty: GgmlType) -> &'static [usize] {
        match ty {
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q2_K => &[80, 82],
            GgmlType::Q3_K => &[108],
            GgmlType::Q6_K => &[208],
            _ => &[0],
        }
    }

    /// Random blocks of `ty` whose f16 fields are finite: scales of 0.001..0.051 and, for the
    /// types with a separate min field, mins of −0.2..0.
    pub(in crate::runtime) fn random_blocks(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        rng: &mut Lcg,
    ) -> Vec<u8> {
        let mut v = Vec::new();
        for _ in 0..rows * cols / ty.block_len() {
            let start = v.len();
            v.extend((0..ty.block_bytes()).map(|_| rng.next() as u8));
            for (i, &off) in f16_fields(ty).iter().enumerate() {
                let x = if i == 0 {
                    0.001 + 0.05 * rng.unif()
                } else {
                    -0.2 * rng.unif()
                };
                v[start + off..start + off + 2].copy_from_slice(&f16::from_f32(x).to_le_bytes());
            }
        }
        v
    }

    /// Every kernel family this CPU can run, the portable one first.
    pub(in crate::runtime) fn runnable() -> Vec<Isa> {
        Isa::ALL
            .into_iter()
            .filter(|&k| k.runs_on(crate::runtime::isa::detect()))
            .collect()
    }

    /// Zeroed activation buffers for the rows of `x`.
    fn sized(x: &[f32], k: usize) -> QActs {
        QActs {
            n: x.len() / k,
            k,
            qs: vec![0; x.len()],
            us: vec![0; x.len()],
            d: vec![0.0; x.len() / QK],
            s: vec![0.0; x.len() / QK],
            h: vec![0.0; x.len() / 16],
            hs: vec![0; x.len() / 16],
            halves: false,
        }
    }

    fn quantize_with(kern: Isa, x: &[f32], k: usize) -> QActs {
        let mut a = sized(x, k);
        // SAFETY: the buffers hold every block of `x`; `runnable` kernels only.
        unsafe { quantize_blocks(kern, x, BlockOut::of(&mut a)) };
        a
    }

    #[test]
    fn simd_quantize_matches_portable() {
        let mut rng = Lcg(7);
        let mut x: Vec<f32> = (0..4 * 576).map(|_| rng.unif() * 6.0 - 3.0).collect();
        x[5] = 0.0;
        x[64..96].fill(0.0); // an all-zero block
        x[100] = 1e-30;
        x[200] = -7.5; // a block whose extreme is negative
        x[300..332].fill(0.5); // ties of x · id round to even
        let mut b = sized(&x, 576);
        b.quantize_portable(&x);
        let mut pooled = QActs::default();
        pooled.quantize(&x, 576);
        for a in runnable()
            .into_iter()
            .map(|k| quantize_with(k, &x, 576))
            .chain([pooled])
        {
            assert_eq!(a.qs, b.qs);
            assert_eq!(a.us, b.us);
            assert_eq!(a.d, b.d);
            assert_eq!(a.s, b.s);
        }
    }

    /// `Q6S`, `Q3S` and `Q2S` (nibble levels, an offset taken back with the activations' half
    /// sums) and `Q4T` (IQ4 table indices) give the bits of the int8 expansion they replaced, on
    /// every kernel and tile height, in at most 70 % of its memory.
    #[test]
    fn packed_levels_equal_their_int8_expansion() {
        let mut rng = Lcg(11);
        for (ty, fmt, halves, min) in [
            (GgmlType::Q6_K, Fmt::Q6S, true, false),
            (GgmlType::Q3_K, Fmt::Q3S, true, false),
            (GgmlType::Q2_K, Fmt::Q2S, true, true),
            (GgmlType::IQ4_XS, Fmt::Q4T, false, false),
            (GgmlType::IQ4_NL, Fmt::Q4T, false, false),
        ] {
            let (rows, cols) = (40, 512);
            let src = random_blocks(ty, rows, cols, &mut rng);
            let six = Packed::new(ty, rows, cols, &src);
            assert_eq!(six.fmt, fmt);
            let int8 = Fmt::Q8S { halves, min };
            let wide = Packed::new_as(ty, int8, rows, cols, &src);
            assert!(six.nbytes() * 10 < wide.nbytes() * 7, "{ty:?}");
            for n in [1, 2, 5, 7, 16] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.unif() * 4.0 - 2.0).collect();
                let mut qa = QActs::default();
                qa.quantize(&x, cols);
                for kern in runnable() {
                    let run = |p: &Packed| {
                        let mut out = vec![0f32; n * rows];
                        // SAFETY: `out` holds n × rows outputs; a kernel this CPU runs.
                        unsafe {
                            p.matmul_groups_with(kern, &qa, 0, p.groups(), out.as_mut_ptr(), rows)
                        };
                        out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
                    };
                    assert_eq!(run(&six), run(&wide), "{kern:?} {ty:?} n{n}");
                }
            }
        }
    }

    #[test]
    fn kernels_match_references() {
        let mut rng = Lcg(42);
        for ty in GgmlType::ALL.into_iter().filter(|t| !t.is_dense()) {
            // The original three types on every shape; the others (one format each, on
            // shapes their blocks fit) lighter, so that the emulated AArch64 run stays short.
            let legacy = matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0);
            let shapes: &[(usize, usize)] = if legacy {
                &[(16, 32), (37, 96), (200, 576), (48, 1536)]
            } else if ty.block_len() == QK {
                &[(37, 96), (48, 576)]
            } else {
                &[(37, 256), (48, 512)]
            };
            // 33 rows: two full AMX tiles and a one-row tail (x86 only: the emulated AArch64
            // run has no such kernel and is the slow one).
            let rows_n: &[usize] = if legacy && cfg!(target_arch = "x86_64") {
                &[1, 3, 4, 5, 8, 9, 16, 17, 33]
            } else if legacy {
                &[1, 3, 4, 5, 8, 9, 16, 17]
            } else {
                &[1, 3, 6, 9, 17]
            };
            for &(rows, cols) in shapes {
                let src = random_blocks(ty, rows, cols, &mut rng);
                let p = Packed::new(ty, rows, cols, &src);
                let mut w = vec![0f32; rows * cols];
                dequantize(ty, &src, &mut w);
                // Repacked rows dequantise to exactly the GGML values.
                let mut row = vec![0f32; cols];
                for r in 0..rows {
                    p.row_into(r, &mut row);
                    assert_eq!(row, w[r * cols..(r + 1) * cols], "{ty:?} row {r}");
                }
                for &n in rows_n {
                    let x: Vec<f32> = (0..n * cols).map(|_| rng.unif() * 4.0 - 2.0).collect();
                    let mut qa = QActs::default();
                    qa.quantize(&x, cols);
                    let mut port = vec![0f32; n * rows];
                    // SAFETY: `port` holds n × rows outputs.
                    unsafe {
                        p.matmul_groups_portable(&qa, 0, p.groups(), port.as_mut_ptr(), rows)
                    };
                    for kern in runnable() {
                        let mut fast = vec![0f32; n * rows];
                        // SAFETY: as above; a kernel this CPU runs.
                        unsafe {
                            p.matmul_groups_with(kern, &qa, 0, p.groups(), fast.as_mut_ptr(), rows)
                        };
                        // A row's output does not depend on the rows computed beside it.
                        for t in 0..n {
                            let mut one = vec![0f32; rows];
                            let mut qt = QActs::default();
                            qt.quantize(&x[t * cols..(t + 1) * cols], cols);
                            // SAFETY: `one` holds 1 × rows outputs.
                            unsafe {
                                p.matmul_groups_with(
                                    kern,
                                    &qt,
                                    0,
                                    p.groups(),
                                    one.as_mut_ptr(),
                                    rows,
                                )
                            };
                            assert_eq!(one, fast[t * rows..(t + 1) * rows], "{kern:?} {ty:?} n{n}");
                        }
                        for t in 0..n {
                            for r in 0..rows {
                                let xr = &x[t * cols..(t + 1) * cols];
                                let wr = &w[r * cols..(r + 1) * cols];
                                let exact: f64 =
                                    wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
                                let mag: f64 = wr
                                    .iter()
                                    .zip(xr)
                                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                                    .sum();
                                let (f, q) = (fast[t * rows + r] as f64, port[t * rows + r] as f64);
                                // SIMD and portable run the same integer arithmetic: f32 rounding only.
                                assert!(
                                    (f - q).abs() <= 1e-5 * mag + 1e-6,
                                    "{kern:?} {ty:?} {rows}x{cols} n{n}: {f} vs {q}"
                                );
                                // Int8 activations: |x − d·q| ≤ d/2 with d = amax/127 per block.
                                let bound: f64 = (0..cols)
                                    .map(|i| {
                                        let b = i / QK;
                                        let amax = xr[b * QK..(b + 1) * QK]
                                            .iter()
                                            .fold(0f32, |a, v| a.max(v.abs()));
                                        wr[i].abs() as f64 * amax as f64 / 254.0
                                    })
                                    .sum();
                                assert!(
                                    (f - exact).abs() <= bound * 1.001 + 1e-4 * mag + 1e-6,
                                    "{ty:?}: {f} vs exact {exact}, bound {bound}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod timing {
    use super::*;

    /// Single-thread kernel throughput (run with `--ignored --nocapture`).
    #[test]
    #[ignore]
    fn kernel_gmacs() {
        for (ty, rows, cols) in [
            (GgmlType::Q4_1, 1536, 576),
            (GgmlType::Q8_0, 1536, 576),
            (GgmlType::Q4_1, 65536, 576),
            (GgmlType::Q8_0, 49152, 576),
            (GgmlType::Q4_K, 1536, 1536),
            (GgmlType::Q5_K, 1536, 1536),
            (GgmlType::Q6_K, 1536, 1536),
        ] {
            let src: Vec<u8> = (0..rows * ty.row_bytes(cols))
                .map(|i| (i * 37 % 251) as u8 & 0x3F)
                .collect();
            let p = Packed::new(ty, rows, cols, &src);
            for n in [1, 2, 3, 4, 5, 6, 8, 12, 16]
                .into_iter()
                .filter(|&n| (rows < 10_000 && cols < 1536) || [1, 4, 16].contains(&n))
            {
                let x: Vec<f32> = (0..n * cols).map(|i| (i % 17) as f32 - 8.0).collect();
                let mut qa = QActs::default();
                qa.quantize(&x, cols);
                let mut out = vec![0f32; n * rows];
                let reps = 2000 / n * 1536 / rows * 576 / cols + 3;
                // Best of five timings: this VM's neighbours make single timings noisy.
                let dt = (0..5)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        for _ in 0..reps {
                            unsafe { p.matmul_groups(&qa, 0, p.groups(), out.as_mut_ptr(), rows) };
                        }
                        t.elapsed().as_secs_f64() / reps as f64
                    })
                    .fold(f64::INFINITY, f64::min);
                eprintln!(
                    "{ty:?} n={n}: {:.1} GMAC/s, {:.1} GB/s",
                    (rows * cols * n) as f64 / dt / 1e9,
                    p.nbytes() as f64 / dt / 1e9
                );
            }
        }
    }
}
