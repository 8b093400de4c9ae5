//! Every quantized GGML type as sub-blocks of integer levels: per block a float scale `d` (and,
//! for the types with an offset, a float `dmin`), per sub-block of 16 or 32 elements a small
//! integer scale `sc` (and `m`), such that `x = level · (d·sc)` (or `level · (d·sc) + dmin·m`)
//! is ggml's dequantised value bit for bit: ggml forms the same f32 products (`d · sc`,
//! `dmin · m`, subtracted, which is adding `(−dmin) · m`). Types without sub-block scales have
//! `sc = 1` (and `m = 1`). Block layouts
//! (little-endian, as in ggml; `QK_K` = 256):
//! - Q5_0 `d: f16, qh: u32, qs: [u8; 16]`; Q5_1 adds `m: f16` after `d`: five-bit levels, the
//!   fifth bit of element j in bit j of `qh` (Q5_0 levels are offset by −16).
//! - Q2_K `scales: [u8; 16], qs: [u8; 64], d, dmin`: 16 sub-blocks of 16, 2-bit levels, 4-bit
//!   scale and min per sub-block.
//! - Q3_K `hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d`: 3-bit levels (−4..3), 6-bit
//!   scales offset by 32.
//! - Q4_K `d, dmin, scales: [u8; 12], qs: [u8; 128]`: 8 sub-blocks of 32, 6-bit scale and min.
//! - Q5_K as Q4_K with `qh: [u8; 32]` before `qs`.
//! - Q6_K `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d`: 16 sub-blocks of 16, levels −32..31.
//! - IQ4_NL `d, qs: [u8; 16]`: 4-bit indices into a fixed table of 16 int8 values.
//! - IQ4_XS `d, scales_h: u16, scales_l: [u8; 4], qs: [u8; 128]`: 8 sub-blocks of 32 with 6-bit
//!   scales offset by 32, the IQ4_NL table.

use super::ggml::GgmlType;
use half::f16;

/// IQ4_NL's and IQ4_XS's levels.
pub const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

impl GgmlType {
    /// Elements per sub-block (one scale each).
    pub fn sub_len(self) -> usize {
        match self {
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q6_K => 16,
            _ => 32,
        }
    }

    /// Whether a sub-block has an offset besides its scale.
    pub fn has_min(self) -> bool {
        matches!(
            self,
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q2_K | GgmlType::Q4_K | GgmlType::Q5_K
        )
    }
}

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Q4_K's and Q5_K's 6-bit scale and min of sub-block `j` (of 8) from the 12 packed bytes.
#[inline]
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q3_K's 16 six-bit scales (offset by 32) from the 12 packed bytes.
#[inline]
fn scales_q3k(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for i in 0..4 {
        let hi = s[8 + i];
        out[i] = ((s[i] & 0xF) | ((hi & 3) << 4)) as i8 - 32;
        out[4 + i] = ((s[4 + i] & 0xF) | (((hi >> 2) & 3) << 4)) as i8 - 32;
        out[8 + i] = ((s[i] >> 4) | (((hi >> 4) & 3) << 4)) as i8 - 32;
        out[12 + i] = ((s[4 + i] >> 4) | (((hi >> 6) & 3) << 4)) as i8 - 32;
    }
    out
}

/// Unpacks one block of `ty` (`ty.block_bytes()` bytes) into `q` (`ty.block_len()` levels) and
/// `sc`, `m` (one per sub-block; `m` is left alone for types without offsets); returns the
/// block's `(d, dmin)` (`dmin` 0 for types without offsets). Dense types are not block types
/// and panic here.
pub fn unpack(ty: GgmlType, b: &[u8], q: &mut [i8], sc: &mut [i8], m: &mut [i8]) -> (f32, f32) {
    debug_assert_eq!(b.len(), ty.block_bytes());
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::IQ4_NL => {
            let d = f16_at(b, 0);
            sc[0] = 1;
            let (off, dmin) = match ty {
                GgmlType::Q4_1 | GgmlType::Q5_1 => {
                    m[0] = 1;
                    (4, f16_at(b, 2))
                }
                _ => (2, 0.0),
            };
            let five = matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1);
            let qh = if five {
                u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
            } else {
                0
            };
            let qs = &b[off + if five { 4 } else { 0 }..];
            for j in 0..16 {
                let (mut lo, mut hi) = (qs[j] & 0xF, qs[j] >> 4);
                if five {
                    lo |= (((qh >> j) << 4) & 0x10) as u8;
                    hi |= ((qh >> (j + 12)) & 0x10) as u8;
                }
                let level = |v: u8| match ty {
                    GgmlType::Q4_0 => v as i8 - 8,
                    GgmlType::Q5_0 => v as i8 - 16,
                    GgmlType::IQ4_NL => IQ4_VALUES[v as usize],
                    _ => v as i8,
                };
                q[j] = level(lo);
                q[j + 16] = level(hi);
            }
            (d, dmin)
        }
        GgmlType::Q8_0 => {
            sc[0] = 1;
            for (d, &s) in q.iter_mut().zip(&b[2..34]) {
                *d = s as i8;
            }
            (f16_at(b, 0), 0.0)
        }
        GgmlType::Q2_K => {
            for (i, &s) in b[..16].iter().enumerate() {
                sc[i] = (s & 0xF) as i8;
                m[i] = (s >> 4) as i8;
            }
            let (q, qs) = (&mut q[..256], &b[16..80]);
            for n in 0..2 {
                for j in 0..4 {
                    for l in 0..32 {
                        q[n * 128 + j * 32 + l] = ((qs[n * 32 + l] >> (2 * j)) & 3) as i8;
                    }
                }
            }
            (f16_at(b, 80), -f16_at(b, 82))
        }
        GgmlType::Q3_K => {
            let q = &mut q[..256];
            sc[..16].copy_from_slice(&scales_q3k(&b[96..108]));
            let (hm, qs) = (&b[..32], &b[32..96]);
            for n in 0..2 {
                for j in 0..4 {
                    let bit = 1u8 << (4 * n + j);
                    for l in 0..32 {
                        let lo = ((qs[n * 32 + l] >> (2 * j)) & 3) as i8;
                        let sub = if hm[l] & bit != 0 { 0 } else { 4 };
                        q[n * 128 + j * 32 + l] = lo - sub;
                    }
                }
            }
            (f16_at(b, 108), 0.0)
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            // Fixed lengths, so that the loops below index without bounds checks.
            let q = &mut q[..256];
            let s = &b[4..16];
            for j in 0..8 {
                let (a, c) = scale_min_k4(j, s);
                sc[j] = a as i8;
                m[j] = c as i8;
            }
            let five = ty == GgmlType::Q5_K;
            let (qh, qs) = if five {
                (&b[16..48], &b[48..176])
            } else {
                (&b[..0], &b[16..144])
            };
            for c in 0..4 {
                for l in 0..32 {
                    let v = qs[c * 32 + l];
                    let (mut lo, mut hi) = (v & 0xF, v >> 4);
                    if five {
                        lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                        hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                    }
                    q[c * 64 + l] = lo as i8;
                    q[c * 64 + 32 + l] = hi as i8;
                }
            }
            (f16_at(b, 0), -f16_at(b, 2))
        }
        GgmlType::Q6_K => {
            let q = &mut q[..256];
            for (s, &v) in sc.iter_mut().zip(&b[192..208]) {
                *s = v as i8;
            }
            let (ql, qh) = (&b[..128], &b[128..192]);
            for n in 0..2 {
                let (ql, qh) = (&ql[n * 64..], &qh[n * 32..]);
                let y = &mut q[n * 128..(n + 1) * 128];
                for l in 0..32 {
                    let h = qh[l];
                    y[l] = ((ql[l] & 0xF) | ((h & 3) << 4)) as i8 - 32;
                    y[l + 32] = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i8 - 32;
                    y[l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                    y[l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
                }
            }
            (f16_at(b, 208), 0.0)
        }
        GgmlType::IQ4_XS => {
            let sh = u16::from_le_bytes([b[2], b[3]]);
            let (sl, qs) = (&b[4..8], &b[8..136]);
            for ib in 0..8 {
                let ls =
                    ((sl[ib / 2] >> (4 * (ib % 2))) & 0xF) | ((((sh >> (2 * ib)) & 3) as u8) << 4);
                sc[ib] = ls as i8 - 32;
                for j in 0..16 {
                    let v = qs[ib * 16 + j];
                    q[ib * 32 + j] = IQ4_VALUES[(v & 0xF) as usize];
                    q[ib * 32 + 16 + j] = IQ4_VALUES[(v >> 4) as usize];
                }
            }
            (f16_at(b, 0), 0.0)
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            unreachable!("{ty:?} is not a block type")
        }
    }
}

/// Dequantises whole blocks of a quantized `ty` from `src` into `dst` through [`unpack`].
pub fn dequantize_blocks(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    let (bl, sub) = (ty.block_len(), ty.sub_len());
    let mut q = vec![0i8; bl];
    let (mut sc, mut m) = (vec![0i8; bl / sub], vec![0i8; bl / sub]);
    for (y, b) in dst
        .chunks_exact_mut(bl)
        .zip(src.chunks_exact(ty.block_bytes()))
    {
        let (d, dmin) = unpack(ty, b, &mut q, &mut sc, &mut m);
        for (i, (y, &l)) in y.iter_mut().zip(&q).enumerate() {
            let s = i / sub;
            let x = l as f32 * (d * sc[s] as f32);
            *y = if ty.has_min() {
                x + dmin * m[s] as f32
            } else {
                x
            };
        }
    }
}
