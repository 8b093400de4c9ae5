//! The repacked weight matrix: GGML blocks rearranged at load into groups of 16 output rows
//! (see the module docs of [`super`] for the chunk layout), in one of four formats:
//!
//! | format | from | per 32 inputs of a row | bits / weight |
//! |---|---|---|---|
//! | `Q4` | Q4_0, Q4_1 | 16 B nibbles, f16 scale and min | 5 |
//! | `Q8` | Q8_0 | 32 B int8, f16 scale, i16 weight sum | 9 |
//! | `Q4S` | Q4_K | 16 B nibbles, i8 sub-scale and sub-min; f16 `d`, `dmin` per 256 | 4.6 |
//! | `Q5S` | Q5_0, Q5_1, Q5_K | as `Q4S` (`d`, `dmin` per GGML block) plus a 4 B plane of fifth bits | 5.6–6.1 |
//! | `Q6S` | Q6_K | levels + 32 (0..63): 16 B nibbles plus an 8 B plane of the two high bits, an i8 sub-scale per 16; f16 `d` per GGML block | 6.6 |
//! | `Q3S` | Q3_K | levels + 4 (0..7): their low two bits four a byte (8 B), a 4 B plane of third bits, an i8 sub-scale per 16; f16 `d` per GGML block | 3.6 |
//! | `Q2S` | Q2_K | levels 0..3, four a byte (8 B), an i8 sub-scale and sub-min per 16; f16 `d`, `dmin` per GGML block | 3.1 |
//! | `Q4T` | IQ4_NL, IQ4_XS | 16 B nibbles indexing the IQ4 table, an i8 sub-scale and an i16 level sum; f16 `d` per GGML block | 4.8–5.3 |
//! | `Q8S` | (none: the int8 expansion the others are tested against) | 32 B int8 levels, per 16 or 32 inputs an i8 sub-scale (and sub-min) and an i16 level sum | 9.6–10.1 |
//!
//! A weight is `level · (d · sc)` (`+ dmin · m`), the f32 products ggml forms, so every format
//! is exact: a row dequantises to ggml's values bit for bit.

use super::buf::HugeBuf;
use super::{GgmlType, QActs, GROUP, QK};
use crate::runtime::blocks::{unpack, IQ4_VALUES};
use crate::runtime::pool::{par_ranges, SendPtr};
use half::f16;

/// The index of an IQ4 level in [`IQ4_VALUES`] (the levels are distinct).
fn iq4_index(level: i8) -> u8 {
    IQ4_VALUES.iter().position(|&v| v == level).unwrap_or(0) as u8
}

/// Codes of the level layouts [`Packed::level_of`] is compiled for.
struct Lv;
impl Lv {
    const INT8: u8 = 0;
    const Q2: u8 = 1;
    const Q3: u8 = 2;
    const Q4T: u8 = 3;
    const Q6: u8 = 4;
    const Q5: u8 = 5;
    /// Plain nibbles (Q4, Q4S).
    const NIB: u8 = 6;
}

/// Evaluates `$e` with the constant `$l` bound to the [`Lv`] layout of format `$fmt`, one arm
/// per layout, so that what `$e` calls generically is compiled once per layout.
macro_rules! by_level {
    ($fmt:expr, $l:ident => $e:expr) => {
        match $fmt {
            f if f.int8() => {
                const $l: u8 = Lv::INT8;
                $e
            }
            Fmt::Q2S => {
                const $l: u8 = Lv::Q2;
                $e
            }
            Fmt::Q3S => {
                const $l: u8 = Lv::Q3;
                $e
            }
            Fmt::Q4T => {
                const $l: u8 = Lv::Q4T;
                $e
            }
            Fmt::Q6S => {
                const $l: u8 = Lv::Q6;
                $e
            }
            Fmt::Q5S => {
                const $l: u8 = Lv::Q5;
                $e
            }
            _ => {
                const $l: u8 = Lv::NIB;
                $e
            }
        }
    };
}

/// How a [`Packed`] matrix stores its weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fmt {
    /// Nibbles, f16 scale and min per 32 inputs (Q4_0 as Q4_1 with m = −8d).
    Q4,
    /// Int8, f16 scale per 32 inputs.
    Q8,
    /// Nibbles; per 32 inputs an i8 sub-scale and sub-min, per GGML block f16 `d` and `dmin`.
    Q4S,
    /// `Q4S` with a fifth bit per weight (levels 0..31; Q5_0's offset of 16 as its min).
    Q5S,
    /// Six-bit levels stored as level + 32 (0..63): nibbles as `Q4S` plus a plane of the two
    /// high bits; an i8 sub-scale per 16 inputs, f16 `d` per GGML block. The kernels take the
    /// offset back with the activations' integer sums per 16.
    Q6S,
    /// Three-bit levels stored as level + 4 (0..7), a sub-scale per 16 inputs, the offset taken
    /// back as `Q6S`'s: the low two bits in `Q2S`'s layout, the third in a 64-byte register per
    /// (group, block) whose byte `4·row + j` has at bit `4r + s` that of input `16r + 4s + j`.
    Q3S,
    /// Two-bit levels (0..3), four a byte; per 16 inputs an i8 sub-scale and sub-min, per GGML
    /// block f16 `d` and `dmin`. Of a (group, block)'s two 64-byte registers, register 0 holds
    /// the first 16 inputs and register 1 the last 16: byte `4·row + j` of register `r` has at
    /// bits `2s..2s + 2` the level of input `16r + 4s + j`.
    Q2S,
    /// Nibbles indexing the IQ4 table of 16 int8 levels; an i8 sub-scale and an i16 level sum
    /// per 32 inputs, f16 `d` per GGML block.
    Q4T,
    /// Int8 levels; per 16 (`halves`) or 32 inputs an i8 sub-scale (and sub-min when `min`), per
    /// GGML block f16 `d` (and `dmin`).
    Q8S { halves: bool, min: bool },
}

impl Fmt {
    /// Whether its kernels read the activations' sums per 16 inputs (`QActs::h`, `hs`): the
    /// formats with a sub-scale per 16.
    pub fn half_sums(self) -> bool {
        matches!(
            self,
            Fmt::Q6S | Fmt::Q3S | Fmt::Q2S | Fmt::Q8S { halves: true, .. }
        )
    }

    pub fn of(ty: GgmlType) -> Fmt {
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 => Fmt::Q4,
            GgmlType::Q8_0 => Fmt::Q8,
            GgmlType::Q4_K => Fmt::Q4S,
            GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K => Fmt::Q5S,
            GgmlType::Q6_K => Fmt::Q6S,
            GgmlType::Q3_K => Fmt::Q3S,
            GgmlType::Q2_K => Fmt::Q2S,
            GgmlType::IQ4_NL | GgmlType::IQ4_XS => Fmt::Q4T,
            _ => Fmt::Q8S {
                halves: ty.sub_len() == 16,
                min: ty.has_min(),
            },
        }
    }

    /// Int8 chunks (512 bytes per group and block) rather than nibbles (256).
    pub fn int8(self) -> bool {
        matches!(self, Fmt::Q8 | Fmt::Q8S { .. })
    }

    /// Whether the kernels correct an unsigned activation operand with the levels' sums (signed
    /// int8 levels: `Q8`, `Q8S`, `Q4T`).
    pub fn wsums(self) -> bool {
        self.int8() || self == Fmt::Q4T
    }

    /// Sub-scale entries per (group, block, row): 2 with a scale per 16 inputs.
    pub fn per_block(self) -> usize {
        match self {
            Fmt::Q8S { halves: true, .. } | Fmt::Q6S | Fmt::Q3S | Fmt::Q2S => 2,
            _ => 1,
        }
    }

    /// Whether weights have an offset term.
    pub fn has_min(self) -> bool {
        matches!(
            self,
            Fmt::Q4 | Fmt::Q4S | Fmt::Q5S | Fmt::Q2S | Fmt::Q8S { min: true, .. }
        )
    }

    /// Bytes of the high-bit plane (`hb`) per (group, block).
    pub(super) fn hb_bytes(self) -> usize {
        match self {
            Fmt::Q6S => 128,
            Fmt::Q3S => 64,
            _ => 0,
        }
    }

    /// What the formats with a sub-scale per 16 (`Q6S`, `Q3S`, `Q2S`) add to a level to
    /// store it unsigned; the kernels take it back with the activations' integer half sums.
    pub fn level_offset(self) -> i8 {
        match self {
            Fmt::Q6S => 32,
            Fmt::Q3S => 4,
            _ => 0,
        }
    }

    /// The formats with one f16 scale (and min) per 32 inputs and no sub-scales.
    pub fn legacy(self) -> bool {
        matches!(self, Fmt::Q4 | Fmt::Q8)
    }
}

/// A quantized matrix repacked for the kernels (rows padded to a multiple of 16).
#[derive(Clone)]
pub struct Packed {
    pub ty: GgmlType,
    pub fmt: Fmt,
    pub rows: usize,
    pub cols: usize,
    /// Group-major, then block: 256 (nibbles) or 512 (int8) bytes per (group, block).
    pub(super) q: HugeBuf<u8>,
    /// `Q4`, `Q8`: f16 scales per (group, block, row).
    pub(super) d: HugeBuf<f16>,
    /// `Q4`: f16 mins per (group, block, row).
    pub(super) m: HugeBuf<f16>,
    /// Int8 formats: per (group, block, [half,] row) sum of the int8 weights.
    pub(super) wsum: HugeBuf<i16>,
    /// Sub-scaled formats (`Q4S`, `Q5S`, `Q8S`): the GGML block's `d` per (group, GGML block, row).
    pub(super) sd: HugeBuf<f16>,
    /// Sub-scaled formats with mins: the GGML block's `dmin` (negated for the K-quants).
    pub(super) sm: HugeBuf<f16>,
    /// Sub-scaled formats: sub-scales per (group, block, [half,] row).
    pub(super) isc: HugeBuf<i8>,
    /// Sub-scaled formats with mins: sub-mins per (group, block, [half,] row).
    pub(super) imn: HugeBuf<i8>,
    /// `Q6S`: per (group, block) two 64-byte registers of high bits, register `i / 2` for chunk
    /// `i`: byte `4·row + j` holds at bits `4·(i % 2)` and `4·(i % 2) + 2` bits 4–5 of the
    /// levels of its low and high nibble in that chunk.
    pub(super) hb: HugeBuf<u8>,
    /// GGML blocks per row.
    nsup: usize,
    /// log2 of the 32-blocks per GGML block (0 or 3).
    bshift: u32,
    /// `Q5S`: per (group, block) 8 masks, chunk `i`'s low then high nibbles: bit `4·row + j`
    /// is the fifth bit of that nibble's level.
    pub(super) qh: HugeBuf<u64>,
}

impl Packed {
    pub(super) fn chunk_bytes(fmt: Fmt) -> usize {
        if fmt.int8() {
            512
        } else if matches!(fmt, Fmt::Q2S | Fmt::Q3S) {
            128
        } else {
            256
        }
    }

    pub fn nbytes(&self) -> usize {
        self.q.len()
            + 2 * (self.d.len() + self.m.len() + self.wsum.len() + self.sd.len() + self.sm.len())
            + self.isc.len()
            + self.imn.len()
            + 8 * self.qh.len()
            + self.hb.len()
    }

    pub fn groups(&self) -> usize {
        self.rows.div_ceil(GROUP)
    }

    /// Where the GGML-block values (`sd`, `sm`) of block `b` of row group `g` start (no
    /// division: the kernels call this per block).
    #[inline(always)]
    pub(super) fn sup_at(&self, g: usize, b: usize) -> usize {
        (g * self.nsup + (b >> self.bshift)) * GROUP
    }

    /// Whether block `b` (of 32 inputs) is the last of its GGML block: where the kernels that
    /// sum a GGML block's sub-scaled blocks apply its `d` (the AVX-512 six-bit tiles).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) fn sup_end(&self, b: usize) -> bool {
        (b + 1) & ((1 << self.bshift) - 1) == 0
    }

    /// An empty matrix of `rows × cols` in `fmt` with every buffer sized.
    fn zeroed(ty: GgmlType, fmt: Fmt, rows: usize, cols: usize) -> Packed {
        let groups = rows.div_ceil(GROUP);
        let n = groups * (cols / QK) * GROUP;
        let per = n * fmt.per_block();
        let sup = groups * (cols / ty.block_len()) * GROUP;
        let legacy = fmt.legacy();
        let pick = |yes: bool, k: usize| if yes { k } else { 0 };
        Packed {
            ty,
            fmt,
            rows,
            cols,
            q: HugeBuf::zeroed(n / GROUP * Self::chunk_bytes(fmt)),
            d: HugeBuf::zeroed(pick(legacy, n)),
            m: HugeBuf::zeroed(pick(fmt == Fmt::Q4, n)),
            wsum: HugeBuf::zeroed(pick(fmt.wsums(), per)),
            sd: HugeBuf::zeroed(pick(!legacy, sup)),
            sm: HugeBuf::zeroed(pick(!legacy && fmt.has_min(), sup)),
            isc: HugeBuf::zeroed(pick(!legacy, per)),
            imn: HugeBuf::zeroed(pick(!legacy && fmt.has_min(), per)),
            qh: HugeBuf::zeroed(pick(fmt == Fmt::Q5S, n / GROUP * 8)),
            hb: HugeBuf::zeroed(n / GROUP * fmt.hb_bytes()),
            nsup: cols / ty.block_len(),
            bshift: (ty.block_len() / QK).trailing_zeros(),
        }
    }

    /// Repacks GGML blocks (`rows × cols`) of any quantized type.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, src: &[u8]) -> Self {
        Self::new_as(ty, Fmt::of(ty), rows, cols, src)
    }

    /// [`Packed::new`] into `fmt`, which must hold `ty`'s levels (a test compares formats).
    pub(super) fn new_as(ty: GgmlType, fmt: Fmt, rows: usize, cols: usize, src: &[u8]) -> Self {
        let mut p = Self::zeroed(ty, fmt, rows, cols);
        let nb = cols / QK;
        let rb = ty.row_bytes(cols);
        if !p.fmt.legacy() {
            assert_eq!(src.len(), rows * rb);
            let whole = Bufs::of(&mut p);
            let geo = (p.ty, p.fmt, p.cols, p.nsup);
            // Row groups in parallel on the pool (one thread took half of loading a 1.7 B
            // Q4_K_M file, 2-vCPU Zen 5 under `perf`): each task has its groups' buffers.
            par_ranges(p.groups(), |g0, g1| {
                // SAFETY: the ranges of groups the pool hands out are disjoint.
                let mut bufs = unsafe { whole.groups(g0, g1) };
                let rows = g0 * GROUP..(g1 * GROUP).min(rows);
                // The row loop compiled once per level layout (no format test per input).
                by_level!(geo.1, L => pack_rows::<L>(&mut bufs, geo, rows, src, rb))
            });
            return p;
        }
        assert!(
            matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0),
            "legacy formats hold Q4_0, Q4_1 and Q8_0"
        );
        assert_eq!(src.len(), rows * rb);
        let (bb, cb) = (ty.block_bytes(), Self::chunk_bytes(p.fmt));
        let whole = Bufs::of(&mut p);
        // Row groups in parallel on the pool (the repack was a third of loading SmolLM2-135M on
        // one thread).
        par_ranges(p.groups(), |g0, g1| {
            // SAFETY: the ranges of groups the pool hands out are disjoint.
            let bufs = unsafe { whole.groups(g0, g1) };
            for r in g0 * GROUP..(g1 * GROUP).min(rows) {
                let (g, lane) = (r / GROUP - g0, r % GROUP);
                for b in 0..nb {
                    let blk = &src[(r * nb + b) * bb..(r * nb + b + 1) * bb];
                    let (gb, at) = (g * nb + b, (g * nb + b) * GROUP + lane);
                    let dv = f16::from_le_bytes([blk[0], blk[1]]);
                    bufs.d[at] = dv;
                    let (qs, steps) = match ty {
                        GgmlType::Q8_0 => {
                            let qs = &blk[2..34];
                            bufs.wsum[at] = qs.iter().map(|&v| v as i8 as i16).sum();
                            (qs, 8)
                        }
                        GgmlType::Q4_1 => {
                            bufs.m[at] = f16::from_le_bytes([blk[2], blk[3]]);
                            (&blk[4..20], 4)
                        }
                        _ => {
                            bufs.m[at] = f16::from_f32(-8.0 * dv.to_f32());
                            (&blk[2..18], 4)
                        }
                    };
                    let dst = &mut bufs.q[gb * cb..(gb + 1) * cb];
                    for i in 0..steps {
                        dst[i * 64 + lane * 4..i * 64 + lane * 4 + 4]
                            .copy_from_slice(&qs[4 * i..4 * i + 4]);
                    }
                }
            }
        });
        p
    }
}

/// Where each buffer of a packed matrix starts and how long one row group's part of it is:
/// [`Bufs::groups`] lends a task the parts of its groups.
#[derive(Clone, Copy)]
struct Bufs {
    q: (SendPtr<u8>, usize),
    d: (SendPtr<f16>, usize),
    m: (SendPtr<f16>, usize),
    wsum: (SendPtr<i16>, usize),
    sd: (SendPtr<f16>, usize),
    sm: (SendPtr<f16>, usize),
    isc: (SendPtr<i8>, usize),
    imn: (SendPtr<i8>, usize),
    hb: (SendPtr<u8>, usize),
    qh: (SendPtr<u64>, usize),
}

/// The buffers of row groups `g0..`, indexed from group `g0` (see [`pack_row`]).
struct GroupBufs<'a> {
    g0: usize,
    q: &'a mut [u8],
    d: &'a mut [f16],
    m: &'a mut [f16],
    wsum: &'a mut [i16],
    sd: &'a mut [f16],
    sm: &'a mut [f16],
    isc: &'a mut [i8],
    imn: &'a mut [i8],
    hb: &'a mut [u8],
    qh: &'a mut [u64],
}

impl Bufs {
    fn of(p: &mut Packed) -> Bufs {
        let g = p.groups();
        fn part<T: super::buf::Plain>(b: &mut HugeBuf<T>, groups: usize) -> (SendPtr<T>, usize) {
            debug_assert_eq!(b.len() % groups.max(1), 0);
            (SendPtr(b.as_mut_ptr()), b.len() / groups.max(1))
        }
        Bufs {
            q: part(&mut p.q, g),
            d: part(&mut p.d, g),
            m: part(&mut p.m, g),
            wsum: part(&mut p.wsum, g),
            sd: part(&mut p.sd, g),
            sm: part(&mut p.sm, g),
            isc: part(&mut p.isc, g),
            imn: part(&mut p.imn, g),
            hb: part(&mut p.hb, g),
            qh: part(&mut p.qh, g),
        }
    }

    /// Groups `g0..g1` of every buffer.
    ///
    /// # Safety
    /// No two live results may share a group, and the matrix must outlive them.
    unsafe fn groups<'a>(self, g0: usize, g1: usize) -> GroupBufs<'a> {
        unsafe fn take<'a, T>((p, per): (SendPtr<T>, usize), g0: usize, g1: usize) -> &'a mut [T] {
            std::slice::from_raw_parts_mut(p.get().add(g0 * per), (g1 - g0) * per)
        }
        GroupBufs {
            g0,
            q: take(self.q, g0, g1),
            d: take(self.d, g0, g1),
            m: take(self.m, g0, g1),
            wsum: take(self.wsum, g0, g1),
            sd: take(self.sd, g0, g1),
            sm: take(self.sm, g0, g1),
            isc: take(self.isc, g0, g1),
            imn: take(self.imn, g0, g1),
            hb: take(self.hb, g0, g1),
            qh: take(self.qh, g0, g1),
        }
    }
}

/// Packs `rows` of a matrix whose rows are `rb` bytes each in `src`, in layout `L` (the
/// [`Lv`] code of `geo`'s format), through [`pack_row`].
fn pack_rows<const L: u8>(
    bufs: &mut GroupBufs<'_>,
    geo: (GgmlType, Fmt, usize, usize),
    rows: std::ops::Range<usize>,
    src: &[u8],
    rb: usize,
) {
    for r in rows {
        pack_row::<L>(bufs, geo, r, &src[r * rb..(r + 1) * rb]);
    }
}

/// Packs row `r` of a non-legacy format (`geo`: type, format, columns, GGML blocks per row;
/// `L` its layout) from its GGML bytes through [`unpack`] into the buffers of its group.
#[inline(always)]
fn pack_row<const L: u8>(
    bufs: &mut GroupBufs<'_>,
    geo: (GgmlType, Fmt, usize, usize),
    r: usize,
    src: &[u8],
) {
    let (ty, fmt, cols, nsup) = geo;
    let (bl, sub) = (ty.block_len(), ty.sub_len());
    let (nb, cb, per) = (cols / QK, Packed::chunk_bytes(fmt), fmt.per_block());
    let hbb = fmt.hb_bytes();
    let (g, lane) = (r / GROUP - bufs.g0, r % GROUP);
    let mut q = vec![0i8; bl];
    let (mut sc, mut mn) = (vec![0i8; bl / sub], vec![0i8; bl / sub]);
    for (sb, blk) in src.chunks_exact(ty.block_bytes()).enumerate() {
        let (d, mut dmin) = unpack(ty, blk, &mut q, &mut sc, &mut mn);
        if ty == GgmlType::Q5_0 {
            // (q − 16)·d as q·d + d·(−16): unsigned levels, the offset as the min.
            q.iter_mut().for_each(|v| *v += 16);
            (dmin, mn[0]) = (d, -16);
        }
        let at = (g * nsup + sb) * GROUP + lane;
        // `d` and `dmin` are f16 values (negated or not), so f16 holds them exactly.
        bufs.sd[at] = f16::from_f32(d);
        if !bufs.sm.is_empty() {
            bufs.sm[at] = f16::from_f32(dmin);
        }
        for (i, lv) in q.chunks_exact(QK).enumerate() {
            let b = sb * (bl / QK) + i;
            let gb = g * nb + b;
            let dst = &mut bufs.q[gb * cb..(gb + 1) * cb];
            if L == Lv::INT8 {
                for c in 0..8 {
                    for j in 0..4 {
                        dst[c * 64 + lane * 4 + j] = lv[4 * c + j] as u8;
                    }
                }
            } else if L == Lv::Q2 || L == Lv::Q3 {
                for (i, &v) in lv.iter().enumerate() {
                    let (r, s, j) = (i / 16, (i % 16) / 4, i % 4);
                    let u = (v + fmt.level_offset()) as u8;
                    dst[r * 64 + lane * 4 + j] |= (u & 3) << (2 * s);
                    if L == Lv::Q3 {
                        bufs.hb[gb * hbb + lane * 4 + j] |= ((u >> 2) & 1) << (4 * r + s);
                    }
                }
            } else {
                // Q6S stores level + 32 (Q6_K's levels are −32..31).
                let off = fmt.level_offset();
                for c in 0..4 {
                    for j in 0..4 {
                        let (lo, hi) = if L == Lv::Q4T {
                            (iq4_index(lv[4 * c + j]), iq4_index(lv[16 + 4 * c + j]))
                        } else {
                            (
                                (lv[4 * c + j] + off) as u8,
                                (lv[16 + 4 * c + j] + off) as u8,
                            )
                        };
                        if L == Lv::Q6 {
                            let at = gb * hbb + (c / 2) * 64 + lane * 4 + j;
                            let sh = 4 * (c % 2);
                            bufs.hb[at] |= ((lo >> 4) << sh) | ((hi >> 4) << (sh + 2));
                        }
                        dst[c * 64 + lane * 4 + j] = (lo & 0xF) | (hi << 4);
                        if L == Lv::Q5 {
                            let bit = 1u64 << (lane * 4 + j);
                            if lo & 0x10 != 0 {
                                bufs.qh[gb * 8 + 2 * c] |= bit;
                            }
                            if hi & 0x10 != 0 {
                                bufs.qh[gb * 8 + 2 * c + 1] |= bit;
                            }
                        }
                    }
                }
            }
            for h in 0..per {
                let at = (gb * per + h) * GROUP + lane;
                let s = (i * QK + h * 16) / sub;
                bufs.isc[at] = sc[s];
                if !bufs.imn.is_empty() {
                    bufs.imn[at] = mn[s];
                }
                if fmt.wsums() {
                    let part = &lv[h * QK / per..(h + 1) * QK / per];
                    bufs.wsum[at] = part.iter().map(|&v| v as i16).sum();
                }
            }
        }
    }
}

impl Packed {
    /// A matrix of the given rows of this one, in that order, bit for bit (a reduced output
    /// vocabulary).
    pub fn select_rows(&self, rows: &[usize]) -> Packed {
        let nb = self.cols / QK;
        let cb = Self::chunk_bytes(self.fmt);
        let per = self.fmt.per_block();
        let nsup = self.nsup;
        let mut out = Self::zeroed(self.ty, self.fmt, rows.len(), self.cols);
        fn copy<T: Copy>(dst: &mut [T], src: &[T], t: usize, s: usize) {
            if !src.is_empty() {
                dst[t] = src[s];
            }
        }
        for (nr, &r) in rows.iter().enumerate() {
            assert!(r < self.rows, "row {r} out of range");
            let (g, lane) = (r / GROUP, r % GROUP);
            let (ng, nlane) = (nr / GROUP, nr % GROUP);
            for b in 0..nb {
                let (gb, ngb) = (g * nb + b, ng * nb + b);
                for i in 0..cb / 64 {
                    let s = gb * cb + i * 64 + lane * 4;
                    let t = ngb * cb + i * 64 + nlane * 4;
                    out.q[t..t + 4].copy_from_slice(&self.q[s..s + 4]);
                }
                let hbb = self.fmt.hb_bytes();
                for reg in 0..hbb / 64 {
                    let s = gb * hbb + reg * 64 + lane * 4;
                    let t = ngb * hbb + reg * 64 + nlane * 4;
                    out.hb[t..t + 4].copy_from_slice(&self.hb[s..s + 4]);
                }
                if !self.qh.is_empty() {
                    for k in 0..8 {
                        let bits = (self.qh[gb * 8 + k] >> (lane * 4)) & 0xF;
                        out.qh[ngb * 8 + k] |= bits << (nlane * 4);
                    }
                }
                for h in 0..per {
                    let s = (gb * per + h) * GROUP + lane;
                    let t = (ngb * per + h) * GROUP + nlane;
                    copy(&mut out.d, &self.d, t, s);
                    copy(&mut out.m, &self.m, t, s);
                    copy(&mut out.wsum, &self.wsum, t, s);
                    copy(&mut out.isc, &self.isc, t, s);
                    copy(&mut out.imn, &self.imn, t, s);
                }
            }
            for sb in 0..nsup {
                let s = (g * nsup + sb) * GROUP + lane;
                let t = (ng * nsup + sb) * GROUP + nlane;
                copy(&mut out.sd, &self.sd, t, s);
                copy(&mut out.sm, &self.sm, t, s);
            }
        }
        out
    }

    /// Scale and min (0 where the format has none) of row `lane` of group-block `gb` (block `b`
    /// of its row) for input `i` (0..32) of the block, as f32.
    #[inline]
    fn scale_min(&self, gb: usize, b: usize, lane: usize, i: usize) -> (f32, f32) {
        let per = self.fmt.per_block();
        let at = (gb * per + i * per / QK) * GROUP + lane;
        match self.fmt {
            Fmt::Q4 => (self.d[at].to_f32(), self.m[at].to_f32()),
            Fmt::Q8 => (self.d[at].to_f32(), 0.0),
            Fmt::Q4S | Fmt::Q5S | Fmt::Q6S | Fmt::Q3S | Fmt::Q2S | Fmt::Q4T | Fmt::Q8S { .. } => {
                let sup = self.sup_at(gb / (self.cols / QK), b) + lane;
                let d = self.sd[sup].to_f32() * self.isc[at] as f32;
                let m = match (self.sm.get(sup), self.imn.get(at)) {
                    (Some(dm), Some(&mn)) => dm.to_f32() * mn as f32,
                    _ => 0.0,
                };
                (d, m)
            }
        }
    }

    /// The level (integer weight) of input `i` (0..32) of row `lane` in chunk `c` of group-block
    /// `gb`.
    #[inline]
    fn level(&self, c: &[u8], gb: usize, lane: usize, i: usize) -> i32 {
        by_level!(self.fmt, L => self.level_of::<L>(c, gb, lane, i))
    }

    /// [`Packed::level`] for one layout `L` (an [`Lv`] code), so that a loop over a row's
    /// levels is compiled once per layout instead of testing the format at every input.
    #[inline(always)]
    fn level_of<const L: u8>(&self, c: &[u8], gb: usize, lane: usize, i: usize) -> i32 {
        if L == Lv::INT8 {
            (c[(i / 4) * 64 + lane * 4 + i % 4] as i8) as i32
        } else if L == Lv::Q2 || L == Lv::Q3 {
            let (r, s, j) = (i / 16, (i % 16) / 4, i % 4);
            let low = ((c[r * 64 + lane * 4 + j] >> (2 * s)) & 3) as i32;
            if L == Lv::Q3 {
                let third = (self.hb[gb * self.fmt.hb_bytes() + lane * 4 + j] >> (4 * r + s)) & 1;
                (low | (third as i32) << 2) - 4
            } else {
                low
            }
        } else {
            let byte = c[((i % 16) / 4) * 64 + lane * 4 + i % 4];
            let nib = (if i < 16 { byte & 0xF } else { byte >> 4 }) as i32;
            if L == Lv::Q4T {
                IQ4_VALUES[nib as usize] as i32
            } else if L == Lv::Q6 {
                let c = (i % 16) / 4;
                let h = self.hb[gb * self.fmt.hb_bytes() + (c / 2) * 64 + lane * 4 + i % 4];
                let sh = 4 * (c % 2) + if i < 16 { 0 } else { 2 };
                (nib | ((((h >> sh) & 3) as i32) << 4)) - 32
            } else if L == Lv::Q5 {
                let mask = self.qh[gb * 8 + 2 * ((i % 16) / 4) + i / 16];
                nib | ((((mask >> (lane * 4 + i % 4)) & 1) as i32) << 4)
            } else {
                nib
            }
        }
    }

    /// Dequantises row `r` (exactly the values the kernels multiply with, which are GGML's).
    pub fn row_into(&self, r: usize, dst: &mut [f32]) {
        let nb = self.cols / QK;
        let (g, lane) = (r / GROUP, r % GROUP);
        let cb = Self::chunk_bytes(self.fmt);
        let with_min = self.fmt.has_min();
        if self.fmt == Fmt::Q8 && self.ty == GgmlType::Q8_0 {
            // Q8_0 (an output layer's rows, read to build its 4-bit screen at load): the
            // levels are the chunk's bytes, four inputs a lane in each 64-byte step.
            for b in 0..nb {
                let gb = g * nb + b;
                let c = &self.q[gb * cb..(gb + 1) * cb];
                let s = self.d[gb * GROUP + lane].to_f32();
                let out = &mut dst[b * QK..(b + 1) * QK];
                for (i, o) in out.iter_mut().enumerate() {
                    *o = (c[(i / 4) * 64 + lane * 4 + i % 4] as i8) as f32 * s;
                }
            }
            return;
        }
        // The row loop compiled once per layout (the screen of a K-quant output layer is built
        // from these rows at load: 49,152 rows of 2,048 at SmolLM2-1.7B's shape).
        by_level!(self.fmt, L => self.row_levels::<L>(g, lane, with_min, dst))
    }

    /// [`Packed::row_into`]'s general loop for one layout `L`.
    fn row_levels<const L: u8>(&self, g: usize, lane: usize, with_min: bool, dst: &mut [f32]) {
        let nb = self.cols / QK;
        let cb = Self::chunk_bytes(self.fmt);
        // ggml's (q − 8)·d for Q4_0 and (q − 16)·d for Q5_0: the same value as q·d + m, and
        // the same sign of zero.
        let off = match self.ty {
            GgmlType::Q4_0 => Some(8),
            GgmlType::Q5_0 => Some(16),
            _ => None,
        };
        for b in 0..nb {
            let gb = g * nb + b;
            let c = &self.q[gb * cb..(gb + 1) * cb];
            // Scales and mins change at most between the two halves of a block.
            let halves = [
                self.scale_min(gb, b, lane, 0),
                self.scale_min(gb, b, lane, QK / 2),
            ];
            let out = &mut dst[b * QK..(b + 1) * QK];
            for (i, o) in out.iter_mut().enumerate() {
                let (s, m) = halves[i / (QK / 2)];
                let level = self.level_of::<L>(c, gb, lane, i);
                *o = match off {
                    Some(off) => (level - off) as f32 * s,
                    None if with_min => level as f32 * s + m,
                    None => level as f32 * s,
                };
            }
        }
    }

    /// The portable kernel: the same integer arithmetic, scalar.
    ///
    /// # Safety
    /// As for [`Packed::matmul_groups`].
    pub unsafe fn matmul_groups_portable(
        &self,
        a: &QActs,
        g0: usize,
        g1: usize,
        out: *mut f32,
        ld: usize,
    ) {
        let nb = self.cols / QK;
        let cb = Self::chunk_bytes(self.fmt);
        let per = self.fmt.per_block();
        let k = self.cols;
        let has_min = self.fmt.has_min();
        for g in g0..g1 {
            for t in 0..a.n {
                let mut acc = [0f32; GROUP];
                for b in 0..nb {
                    let gb = g * nb + b;
                    let c = &self.q[gb * cb..(gb + 1) * cb];
                    let y = &a.qs[t * k + b * QK..t * k + (b + 1) * QK];
                    let dx = a.d[t * nb + b];
                    for (lane, acc) in acc.iter_mut().enumerate() {
                        for h in 0..per {
                            let span = h * QK / per..(h + 1) * QK / per;
                            let isum: i32 = span
                                .clone()
                                .map(|i| self.level(c, gb, lane, i) * y[i] as i32)
                                .sum();
                            let (dw, mw) = self.scale_min(gb, b, lane, span.start);
                            *acc += if has_min {
                                let sx = if per == 2 {
                                    a.h[(t * nb + b) * 2 + h]
                                } else {
                                    a.s[t * nb + b]
                                };
                                dw * dx * isum as f32 + mw * sx
                            } else {
                                dw * dx * isum as f32
                            };
                        }
                    }
                }
                for (lane, v) in acc.iter().enumerate() {
                    let r = g * GROUP + lane;
                    if r < self.rows {
                        *out.add(t * ld + r) = *v;
                    }
                }
            }
        }
    }
}
