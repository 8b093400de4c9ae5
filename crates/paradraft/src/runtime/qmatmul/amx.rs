//! Intel AMX-INT8 for matmuls of several activation rows (verification, batches, prefill).
//!
//! One `tdpbsud` (Q4) or `tdpbssd` (Q8) multiplies up to 16 activation rows by one 32-block of
//! a 16-row weight group into a 16 × 16 int32 tile: the A tile is the activations' int8 block
//! as quantized (rows `k` bytes apart), the B tile the group's chunk in the VNNI order
//! [`Packed`] already keeps (tile row i holds inputs 4i..4i+4 of the 16 weight rows) — Q8
//! chunks are loaded as they are, Q4 chunks split into low and high nibbles first. The int32
//! tile goes through memory to AVX-512 registers for the per-block scales.
//!
//! Every row's output has the bits the AVX-512 kernel gives it (the integer dot is exact, and
//! the f32 steps are the same operations in the same order), so which kernel runs, and beside
//! which rows, never changes a result: decode (one row) stays on the AVX-512 kernel, which is
//! bound by the weight stream where tiles gain nothing.

use super::{avx512, GgmlType, Packed, QActs, GROUP, QK};
use std::arch::asm;
use std::arch::x86_64::*;

/// Fewer activation rows than this take the AVX-512 kernel: below 8 rows its per-row
/// `vpdpbusd` beats a tile's fixed cost per block (`kernel_gmacs`: Q4_1 at 4 rows 122–127 against
/// 165–171 GMAC/s; at 8 rows 184–191 against 165–172).
pub(super) const MIN_ROWS: usize = 8;

/// Activation rows per tile (a tile holds 16 rows).
const MT: usize = 16;

/// Tile configuration (palette 1): C tiles tmm0/tmm1 (`m` rows × 16 int32), A tiles tmm2/tmm3
/// (`m` rows × 32 bytes), B tiles tmm4/tmm5 (8 rows × 64 bytes); consecutive blocks alternate
/// between the two sets so that one block's tile work overlaps the other's epilogue.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn new(m: usize) -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        let shapes = [(m, 64u16), (m, 64), (m, 32), (m, 32), (8, 64), (8, 64)];
        for (t, &(rows, colsb)) in shapes.iter().enumerate() {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
            c[48 + t] = rows as u8;
        }
        TileConfig(c)
    }
}

/// Blocks whose tiles are issued before the epilogue of the first of them reads its stored C
/// tile: the epilogue trails the tile work by this many blocks.
const LAG: usize = 2;

/// Stored C tiles for the epilogue, a ring of `LAG + 2` (a tile store never overwrites one the
/// epilogue has yet to read).
#[repr(C, align(64))]
struct CTiles([[i32; MT * GROUP]; LAG + 2]);

/// `out[t, r] = Σ_i W[r, i] · x_t[i]` for row groups `g0..g1` (as the AVX-512 kernel).
///
/// # Safety
/// As for [`Packed::matmul_groups`]; the CPU must have AVX-512 VNNI and AMX-INT8, and the OS
/// must have granted this process the tile state ([`crate::runtime::isa`] checks both).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub(super) unsafe fn matmul_groups(
    p: &Packed,
    a: &QActs,
    g0: usize,
    g1: usize,
    out: *mut f32,
    ld: usize,
) {
    if a.n < MIN_ROWS {
        return avx512::matmul_groups(p, a, g0, g1, out, ld);
    }
    let nb = p.cols / QK;
    SCRATCH.with(|cell| {
        let mut s = cell.borrow_mut();
        let s = &mut *s;
        // A Q4 group's B tiles, unpacked for all its blocks before the first is loaded: a
        // tile load right behind the stores that wrote its bytes waits for them (measured 3×
        // slower at 4 rows when each block was unpacked just before its multiply).
        if p.ty != GgmlType::Q8_0 && s.unpacked.len() < nb * 512 + 64 {
            s.unpacked.resize(nb * 512 + 64, 0u8);
        }
        let ub = s.unpacked.as_mut_ptr();
        let ub = ub.add(ub.align_offset(64));
        tiles_pass(p, a, g0, g1, out, ld, ub, &mut s.ctiles);
    });
}

/// Per-thread buffers, kept between calls (a forward makes hundreds of small ones).
struct Scratch {
    unpacked: Vec<u8>,
    ctiles: Box<CTiles>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch {
        unpacked: Vec::new(),
        ctiles: Box::new(CTiles([[0; MT * GROUP]; LAG + 2])),
    });
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
unsafe fn tiles_pass(
    p: &Packed,
    a: &QActs,
    g0: usize,
    g1: usize,
    out: *mut f32,
    ld: usize,
    ub: *mut u8,
    ctiles: &mut CTiles,
) {
    let nb = p.cols / QK;
    let mut t0 = 0;
    while t0 < a.n {
        let m = (a.n - t0).min(MT);
        let cfg = TileConfig::new(m);
        asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        for g in g0..g1 {
            if g + 1 < g1 {
                prefetch_group(p, g + 1, nb);
            }
            let w = if p.ty == GgmlType::Q8_0 {
                p.q.as_ptr().add(g * nb * 512)
            } else {
                unpack_q4(p.q.as_ptr().add(g * nb * 256), nb, ub);
                ub as *const u8
            };
            let acc = by_rows(p.ty, m, p, a, g, t0, w, ctiles);
            let r0 = g * GROUP;
            let valid = (p.rows - r0).min(GROUP);
            for (t, v) in acc.iter().enumerate().take(m) {
                let dst = out.add((t0 + t) * ld + r0);
                if valid == GROUP {
                    _mm512_storeu_ps(dst, *v);
                } else {
                    let mut tmp = [0f32; GROUP];
                    _mm512_storeu_ps(tmp.as_mut_ptr(), *v);
                    std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, valid);
                }
            }
        }
        t0 += m;
    }
    asm!("tilerelease", options(nostack, nomem));
}

/// The group's outputs for activation rows `t0..t0 + m`, monomorphised per tile height so the
/// accumulators stay in registers.
#[inline(always)]
unsafe fn by_rows(
    ty: GgmlType,
    m: usize,
    p: &Packed,
    a: &QActs,
    g: usize,
    t0: usize,
    w: *const u8,
    c: &mut CTiles,
) -> [__m512; MT] {
    macro_rules! arms {
        ($($n:literal)*) => {
            match (ty == GgmlType::Q8_0, m) {
                $((false, $n) => group::<$n, false>(p, a, g, t0, w, c),)*
                $((true, $n) => group::<$n, true>(p, a, g, t0, w, c),)*
                _ => unreachable!("tiles hold 1 to 16 rows"),
            }
        };
    }
    arms!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
}

/// Loads the A tile (activation rows from `y`, `k` bytes apart) and the B tile, multiplies
/// into a zeroed C tile and stores it to `c`: the tiles of parity 0 or 1.
macro_rules! tile_block {
    ($cz:literal, $ta:literal, $tb:literal, $op:literal, $y:expr, $k:expr, $w:expr, $c:expr) => {
        asm!(
            concat!("tilezero ", $cz),
            concat!("tileloadd ", $ta, ", [{y} + {k}*1]"),
            concat!("tileloadd ", $tb, ", [{w} + {s64}*1]"),
            concat!($op, " ", $cz, ", ", $ta, ", ", $tb),
            concat!("tilestored [{c} + {s64}*1], ", $cz),
            y = in(reg) $y,
            k = in(reg) $k,
            w = in(reg) $w,
            c = in(reg) $c,
            s64 = in(reg) 64usize,
            options(nostack),
        )
    };
}

/// Prefetches group `g`'s weight chunks, scales and mins: the weights of a forward come from
/// beyond the L2 cache, and a tile load or unpack that waits on them stalls the tile pipeline.
#[inline(always)]
unsafe fn prefetch_group(p: &Packed, g: usize, nb: usize) {
    let cb = Packed::chunk_bytes(p.ty);
    let q = p.q.as_ptr().add(g * nb * cb);
    for o in (0..nb * cb).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(q.add(o) as *const i8);
    }
    let rows = [p.d.as_ptr() as *const u8, p.m.as_ptr() as *const u8];
    for (i, base) in rows.into_iter().enumerate() {
        if i == 1 && p.m.is_empty() {
            break;
        }
        let base = base.add(g * nb * GROUP * 2);
        for o in (0..nb * GROUP * 2).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(base.add(o) as *const i8);
        }
    }
}

/// Splits a Q4 group's `nb` chunks into B tiles of 512 bytes at `dst` (64-byte aligned):
/// tile rows 0..4 the low nibbles (inputs 4i..4i+4), rows 4..8 the high ones (16 + 4i..).
#[inline(always)]
unsafe fn unpack_q4(src: *const u8, nb: usize, dst: *mut u8) {
    let mask = _mm512_set1_epi8(0x0F);
    for b in 0..nb {
        let (s, d) = (src.add(b * 256), dst.add(b * 512));
        for i in 0..4 {
            let v = _mm512_loadu_si512(s.add(i * 64) as *const _);
            _mm512_store_si512(d.add(i * 64) as *mut _, _mm512_and_si512(v, mask));
            let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
            _mm512_store_si512(d.add(256 + i * 64) as *mut _, hi);
        }
    }
}

/// Block `b`'s tile multiply: activations from row `t0`, B tile at `w + 512 b`, C stored to
/// the parity's buffer.
#[inline(always)]
unsafe fn block_tiles<const Q8: bool>(
    a: &QActs,
    t0: usize,
    b: usize,
    w: *const u8,
    c: &mut CTiles,
) {
    let k = a.k;
    let y = a.qs.as_ptr().add(t0 * k + b * QK);
    let w = w.add(b * 512);
    let c = c.0[b % (LAG + 2)].as_mut_ptr();
    match (Q8, b & 1) {
        (false, 0) => tile_block!("tmm0", "tmm2", "tmm4", "tdpbsud", y, k, w, c),
        (false, _) => tile_block!("tmm1", "tmm3", "tmm5", "tdpbsud", y, k, w, c),
        (true, 0) => tile_block!("tmm0", "tmm2", "tmm4", "tdpbssd", y, k, w, c),
        (true, _) => tile_block!("tmm1", "tmm3", "tmm5", "tdpbssd", y, k, w, c),
    }
}

/// Block `b`'s scales applied to its stored C tile, as the AVX-512 kernel does:
/// acc += f32(Σ q·y) · (d_w · d_x).
#[inline(always)]
unsafe fn block_epilogue<const M: usize>(
    p: &Packed,
    a: &QActs,
    g: usize,
    t0: usize,
    b: usize,
    c: &CTiles,
    acc: &mut [__m512; MT],
) {
    let nb = p.cols / QK;
    let gb = g * nb + b;
    let c = c.0[b % (LAG + 2)].as_ptr();
    let dw = _mm512_cvtph_ps(_mm256_loadu_si256(
        p.d.as_ptr().add(gb * GROUP) as *const __m256i
    ));
    for (t, acc) in acc.iter_mut().enumerate().take(M) {
        let sum = _mm512_load_si512(c.add(t * GROUP) as *const _);
        let dx = _mm512_set1_ps(*a.d.get_unchecked((t0 + t) * nb + b));
        *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, dx), *acc);
    }
}

/// One group's outputs for rows `t0..t0 + M`; the epilogue trails the tiles by [`LAG`]
/// blocks, so the two overlap.
#[inline(always)]
unsafe fn group<const M: usize, const Q8: bool>(
    p: &Packed,
    a: &QActs,
    g: usize,
    t0: usize,
    w: *const u8,
    c: &mut CTiles,
) -> [__m512; MT] {
    let nb = p.cols / QK;
    let mut acc = [_mm512_setzero_ps(); MT];
    for b in 0..nb {
        block_tiles::<Q8>(a, t0, b, w, c);
        if b >= LAG {
            block_epilogue::<M>(p, a, g, t0, b - LAG, c, &mut acc);
        }
    }
    for b in nb.saturating_sub(LAG)..nb {
        block_epilogue::<M>(p, a, g, t0, b, c, &mut acc);
    }
    if !Q8 {
        // The min term in its own accumulator, added last, as the AVX-512 kernel does.
        let mut accm = [_mm512_setzero_ps(); MT];
        for b in 0..nb {
            let gb = g * nb + b;
            let mw = _mm512_cvtph_ps(_mm256_loadu_si256(
                p.m.as_ptr().add(gb * GROUP) as *const __m256i
            ));
            for (t, accm) in accm.iter_mut().enumerate().take(M) {
                let sx = _mm512_set1_ps(*a.s.get_unchecked((t0 + t) * nb + b));
                *accm = _mm512_fmadd_ps(mw, sx, *accm);
            }
        }
        for t in 0..M {
            acc[t] = _mm512_add_ps(acc[t], accm[t]);
        }
    }
    acc
}
