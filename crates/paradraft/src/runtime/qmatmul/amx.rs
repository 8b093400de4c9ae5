//! Intel AMX-INT8 for matmuls of several activation rows (verification, batches, prefill).
//!
//! One `tdpbsud` (Q4 nibbles) or `tdpbssd` (Q8) multiplies up to 16 activation rows by one
//! 32-block of a 16-row weight group into a 16 × 16 int32 tile: the A tile is the rows' int8
//! block as quantized (rows `k` bytes apart), the B tile the group's chunk in the VNNI order
//! [`Packed`] keeps (tile row i holds inputs 4i..4i+4 of the 16 weight rows) — Q8 chunks are
//! loaded as they are, a Q4 group's chunks split into low and high nibbles once, for every row
//! tile. Each block has its own scales, so its int32 tile goes through memory (this CPU has no
//! tile-to-register move) to AVX-512 registers, where the AVX-512 kernel's own f32 steps apply
//! them; that epilogue trails the tile work by [`LAG`] blocks.
//!
//! Every row's output has the bits the AVX-512 kernel gives it (the integer dot is exact, and
//! the f32 steps are the same operations in the same order), so which kernel runs, and beside
//! which rows, never changes a result. Fewer rows than [`MIN_ROWS`] or more than
//! [`MAX_ROWS`], and the formats with sub-scales, stay on the AVX-512 kernel. What bounds this
//! kernel is measured in `examples/amx_blocks.rs` and `docs/performance.md`.

use super::{avx512, Fmt, Packed, QActs, GROUP, QK};
use std::arch::asm;
use std::arch::x86_64::*;

/// The row counts this kernel takes: where whole 135M forwards ran faster on it than on the
/// AVX-512 kernel (`examples/rows_loop`, interleaved, Intel Xeon, 2 threads, min of each
/// round: 16, 32 and 64 rows won 1-24 %; 8 rows lost 2-15 %, 128 lost 8-20 %, 256 lost in 4 of
/// 6 rounds). Below, a tile's
/// fixed cost per block outweighs per-row `vpdpbusd`; above, the sweep over every row's
/// activations for each weight group runs from L2 in 16-row tile loads.
const MIN_ROWS: usize = 16;
const MAX_ROWS: usize = 64;

/// Activation rows per tile (a tile holds 16 rows).
const MT: usize = 16;

/// Blocks whose tiles are issued before the epilogue of the first of them reads its stored C
/// tile.
const LAG: usize = 2;

/// Blocks a Q4 group's unpacking runs ahead of the tile loads that read it: a tile load right
/// behind the stores that wrote its bytes waits for them, and unpacking the whole group first
/// left its tile work idle meanwhile (`kernel_gmacs`, Q4_1 1536 × 576, 16 rows: 137-141 GMAC/s
/// that way, 163-164 this way; Intel Xeon).
const AHEAD: usize = 3;

/// Stored C tiles, a ring of `LAG + 2`: a tile store never overwrites one the epilogue has yet
/// to read.
#[repr(C, align(64))]
struct CTiles([[i32; MT * GROUP]; LAG + 2]);

/// Tile configuration (palette 1) for `m` activation rows: C tiles tmm0/tmm1 (`m` × 16 int32),
/// A tiles tmm2/tmm3 (`m` × 32 bytes), B tiles tmm4/tmm5 (8 × 64 bytes); consecutive blocks
/// alternate between the two sets.
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

/// Whether this kernel takes a matmul of `fmt` with `n` activation rows.
pub(super) fn takes(fmt: Fmt, n: usize) -> bool {
    (MIN_ROWS..=MAX_ROWS).contains(&n) && matches!(fmt, Fmt::Q4 | Fmt::Q8)
}

/// `out[t, r] = Σ_i W[r, i] · x_t[i]` for row groups `g0..g1` (as the AVX-512 kernel).
///
/// # Safety
/// As for [`Packed::matmul_groups`]; the CPU must have AVX-512 VNNI and AMX-INT8, and the OS
/// must have granted this process the tile data ([`crate::runtime::isa`] checks both).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub(super) unsafe fn matmul_groups(
    p: &Packed,
    a: &QActs,
    g0: usize,
    g1: usize,
    out: *mut f32,
    ld: usize,
) {
    if !takes(p.fmt, a.n) {
        return avx512::matmul_groups(p, a, g0, g1, out, ld);
    }
    let nb = p.cols / QK;
    UNPACKED.with(|cell| {
        let mut buf = cell.borrow_mut();
        let need = if p.fmt == Fmt::Q4 { nb * 512 + 64 } else { 0 };
        if buf.len() < need {
            buf.resize(need, 0);
        }
        let ub = buf.as_mut_ptr();
        let ub = ub.add(ub.align_offset(64));
        let mut c = CTiles([[0; MT * GROUP]; LAG + 2]);
        // Full tiles first, then the last rows' shorter one: one tile configuration each.
        let full = a.n / MT * MT;
        for (r0, r1) in [(0, full), (full, a.n)] {
            if r1 > r0 {
                let cfg = TileConfig::new((r1 - r0).min(MT));
                asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
                rows_pass(p, a, g0, g1, r0, r1, out, ld, ub, &mut c);
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    });
}

thread_local! {
    /// A Q4 group's B tiles, unpacked [`AHEAD`] blocks ahead of its first row tile's loads and
    /// read again by its other row tiles; kept between calls.
    static UNPACKED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Groups `g0..g1` for activation rows `r0..r1`, in tiles of the height configured (16, or
/// `r1 - r0` when fewer): each group's weights unpacked once for all its row tiles.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
unsafe fn rows_pass(
    p: &Packed,
    a: &QActs,
    g0: usize,
    g1: usize,
    r0: usize,
    r1: usize,
    out: *mut f32,
    ld: usize,
    ub: *mut u8,
    c: &mut CTiles,
) {
    let nb = p.cols / QK;
    let m = (r1 - r0).min(MT);
    let q8 = p.fmt == Fmt::Q8;
    for g in g0..g1 {
        // Q8 chunks are B tiles as they are; a Q4 group is unpacked into `ub` by its first row
        // tile, a few blocks ahead of the tile loads that read it, and read there by the others.
        let w = if q8 {
            p.q.as_ptr().add(g * nb * 512)
        } else {
            ub as *const u8
        };
        let next = (g + 1 < g1).then_some(g + 1);
        let mut t0 = r0;
        while t0 < r1 {
            let first = t0 == r0;
            // The next group's weights stream in behind the first row tile's blocks.
            let pf = if first { next } else { None };
            let src = (first && !q8).then(|| (p.q.as_ptr().add(g * nb * 256), ub));
            let acc = by_rows(q8, m, p, a, g, t0, w, pf, c, src);
            avx512::store_group(p, g, &acc[..m], out.add(t0 * ld), ld);
            t0 += m;
        }
    }
}

/// The group's outputs for activation rows `t0..t0 + m`, monomorphised per tile height so the
/// accumulators stay in registers.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn by_rows(
    q8: bool,
    m: usize,
    p: &Packed,
    a: &QActs,
    g: usize,
    t0: usize,
    w: *const u8,
    pf: Option<usize>,
    c: &mut CTiles,
    src: Option<(*const u8, *mut u8)>,
) -> [__m512; MT] {
    macro_rules! arms {
        ($($n:literal)*) => {
            match (q8, m) {
                $((false, $n) => group::<$n, false>(p, a, g, t0, w, pf, c, src),)*
                $((true, $n) => group::<$n, true>(p, a, g, t0, w, pf, c, src),)*
                _ => [_mm512_setzero_ps(); MT], // unreachable: tiles hold 1 to 16 rows
            }
        };
    }
    arms!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
}

/// Zeroes C, loads A (activation rows from `y`, `k` bytes apart) and B, multiplies, and
/// stores C to `c`: the tiles of parity 0 or 1.
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

/// Prefetches block `b` of group `g`: its weight chunk, scales and mins.
#[inline(always)]
unsafe fn prefetch_block(p: &Packed, g: usize, b: usize) {
    let nb = p.cols / QK;
    let gb = g * nb + b;
    let cb = Packed::chunk_bytes(p.fmt);
    let q = p.q.as_ptr().add(gb * cb);
    for o in (0..cb).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(q.add(o) as *const i8);
    }
    _mm_prefetch::<_MM_HINT_T0>(p.d.as_ptr().add(gb * GROUP) as *const i8);
    if p.fmt == Fmt::Q4 {
        _mm_prefetch::<_MM_HINT_T0>(p.m.as_ptr().add(gb * GROUP) as *const i8);
    }
}

/// One Q4 chunk of 256 bytes into a B tile of 512 at `d` (64-byte aligned): tile rows 0..4 the
/// low nibbles (inputs 4i..4i+4), rows 4..8 the high ones (16 + 4i..).
#[inline(always)]
unsafe fn unpack_block(s: *const u8, d: *mut u8) {
    let mask = _mm512_set1_epi8(0x0F);
    for i in 0..4 {
        let v = _mm512_loadu_si512(s.add(i * 64) as *const _);
        _mm512_store_si512(d.add(i * 64) as *mut _, _mm512_and_si512(v, mask));
        let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
        _mm512_store_si512(d.add(256 + i * 64) as *mut _, hi);
    }
}

/// Block `b`'s tile multiply: activations from row `t0`, B tile at `w + 512 b`, C stored to
/// its slot of the ring.
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
    let c = c.0[b % (LAG + 2)].as_ptr();
    let dw = _mm512_cvtph_ps(_mm256_loadu_si256(
        p.d.as_ptr().add((g * nb + b) * GROUP) as *const __m256i
    ));
    for (t, acc) in acc.iter_mut().enumerate().take(M) {
        let sum = _mm512_cvtepi32_ps(_mm512_load_si512(c.add(t * GROUP) as *const _));
        let dx = _mm512_set1_ps(*a.d.get_unchecked((t0 + t) * nb + b));
        *acc = _mm512_fmadd_ps(sum, _mm512_mul_ps(dw, dx), *acc);
    }
}

/// One group's outputs for rows `t0..t0 + M`, prefetching group `pf`'s weights on the way;
/// `src` = (the Q4 group's chunks, where to unpack them) on its first row tile.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn group<const M: usize, const Q8: bool>(
    p: &Packed,
    a: &QActs,
    g: usize,
    t0: usize,
    w: *const u8,
    pf: Option<usize>,
    c: &mut CTiles,
    src: Option<(*const u8, *mut u8)>,
) -> [__m512; MT] {
    let nb = p.cols / QK;
    let mut acc = [_mm512_setzero_ps(); MT];
    if let Some((s, d)) = src {
        for b in 0..AHEAD.min(nb) {
            unpack_block(s.add(b * 256), d.add(b * 512));
        }
    }
    for b in 0..nb {
        if let Some((s, d)) = src {
            if b + AHEAD < nb {
                unpack_block(s.add((b + AHEAD) * 256), d.add((b + AHEAD) * 512));
            }
        }
        let bt = w.add(b * 512);
        block_tiles::<Q8>(a, t0, b, bt, c);
        if let Some(n) = pf {
            prefetch_block(p, n, b);
        }
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
            let mw = _mm512_cvtph_ps(_mm256_loadu_si256(
                p.m.as_ptr().add((g * nb + b) * GROUP) as *const __m256i
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
