//! The cache's own tests (kernels read it in `runtime/attention/tests.rs`).
use super::*;

use crate::runtime::quant::{dequantize, quantize_q8_0, GgmlType};

#[test]
fn bytes_per_slot_counts_k_and_v_of_every_layer() {
    // 2 · layers · KV heads · a row of 64: f16 128 bytes, f32 256, q8_0 two blocks of 34.
    for (dtype, row) in [
        (KvDtype::F16, 128),
        (KvDtype::F32, 256),
        (KvDtype::Q8_0, 68),
    ] {
        let kv = KvCache::with_dtype(3, 2, 64, 40, dtype);
        assert_eq!(kv.bytes_per_slot(), 2 * 3 * 2 * row);
        assert_eq!(kv.bytes_per_slot(), bytes_per_slot(3, 2, 64, dtype));
    }
    // A head size of 80 ends in a block of 16: 80 + 3 scales.
    assert_eq!(KvDtype::Q8_0.row_bytes(80), 86);
    assert_eq!("q8_0".parse::<KvDtype>(), Ok(KvDtype::Q8_0));
    assert!("q4_0".parse::<KvDtype>().unwrap_err().contains("q8_0"));
}

/// What the cache holds for KV head `g` of slot `slot` of layer `li`, as f32 values.
pub(crate) fn read(kv: &KvCache, li: usize, g: usize, slot: usize) -> (Vec<f32>, Vec<f32>) {
    fn typed<E: KvElem>(l: KvLayer<E>, geom: Geom, g: usize, slot: usize) -> (Vec<f32>, Vec<f32>) {
        let (hd, nb) = (geom.head_dim, E::blocks(geom.head_dim));
        let (kb, sb) = (geom.k_at(g, slot), geom.ks_at(nb, g, slot));
        let (vb, vsb) = (
            (g * geom.capacity + slot) * hd,
            (g * geom.capacity + slot) * nb,
        );
        let scaled = |x: E, s: Option<&f16>| x.get() * s.map_or(1.0, |s| s.to_f32());
        let k = (0..hd)
            .map(|d| scaled(l.k[kb + d * KV_TILE], l.ks.get(sb + d / QK * KV_TILE)))
            .collect();
        let v = (0..hd)
            .map(|d| scaled(l.v[vb + d], l.vs.get(vsb + d / QK)))
            .collect();
        (k, v)
    }
    let slot = phys(&kv.table, slot);
    match kv.layer(li) {
        KvLayerRef::F32(l) => typed(l, kv.geom, g, slot),
        KvLayerRef::F16(l) => typed(l, kv.geom, g, slot),
        KvLayerRef::Q8(l) => typed(l, kv.geom, g, slot),
    }
}

/// A row through llama.cpp's reference Q8_0 quantiser and back (`quantize_q8_0`,
/// `dequantize`), padded with zeros to whole blocks.
pub(crate) fn q8_roundtrip(x: &[f32]) -> Vec<f32> {
    let mut padded = x.to_vec();
    padded.resize(x.len().div_ceil(QK) * QK, 0.0);
    let mut out = vec![0f32; padded.len()];
    dequantize(GgmlType::Q8_0, &quantize_q8_0(&padded), &mut out);
    out.truncate(x.len());
    out
}

/// A Q8_0 cache holds what llama.cpp's Q8_0 quantiser makes of each KV head's row (head
/// sizes that are and are not multiples of 32); after a tree compaction and a copy into a
/// cache of another capacity every slot still holds its row, scales included.
#[test]
fn q8_0_rows_are_ggml_blocks_and_survive_moves() {
    let mut seed = 5u64;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 6.0
    };
    for hd in [64, 80, 20, 8] {
        let (layers, heads, n) = (2, 3, 37);
        let k: Vec<f32> = (0..n * heads * hd).map(|_| next()).collect();
        let mut v: Vec<f32> = (0..n * heads * hd).map(|_| next()).collect();
        v[..hd].fill(0.0); // an all-zero block: scale 0, values 0
        let mut kv = KvCache::with_dtype(layers, heads, hd, 50, KvDtype::Q8_0);
        kv.reserve(n).unwrap();
        for li in 0..layers {
            kv.write(li, 0, &k, &v);
        }
        let row = |x: &[f32], s: usize, g: usize| x[(s * heads + g) * hd..][..hd].to_vec();
        for li in 0..layers {
            for s in 0..n {
                for g in 0..heads {
                    let (gk, gv) = read(&kv, li, g, s);
                    assert_eq!(
                        gk,
                        q8_roundtrip(&row(&k, s, g)),
                        "hd {hd} K slot {s} head {g}"
                    );
                    assert_eq!(
                        gv,
                        q8_roundtrip(&row(&v, s, g)),
                        "hd {hd} V slot {s} head {g}"
                    );
                }
            }
        }
        let kept: Vec<usize> = vec![3, 17, 18, 30, 36];
        let slots: Vec<SlotId> = kept.iter().map(|&s| SlotId(s as u32)).collect();
        kv.compact(2, &slots).unwrap();
        let mut copy = KvCache::with_dtype(layers, heads, hd, 9, KvDtype::Q8_0);
        copy.copy_from(&kv, 7).unwrap();
        for (dst, src) in [0, 1].into_iter().zip([0, 1]).chain((2..).zip(kept)) {
            for g in 0..heads {
                let want = (
                    q8_roundtrip(&row(&k, src, g)),
                    q8_roundtrip(&row(&v, src, g)),
                );
                assert_eq!(read(&kv, 1, g, dst), want, "hd {hd} compacted slot {dst}");
                assert_eq!(read(&copy, 1, g, dst), want, "hd {hd} copied slot {dst}");
            }
        }
    }
}

/// The SIMD f32 → f16 conversions give `f16::from_f32`'s bits: ties to even, subnormals,
/// overflow to infinity, signed zeros, lengths that are not multiples of the vector.
#[cfg(target_arch = "x86_64")]
#[test]
fn simd_f16_conversion_matches_scalar() {
    let mut src: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.37).collect();
    src.extend([
        0.0,
        -0.0,
        1.0 + f32::EPSILON,
        1.000_488_3, // halfway between two f16 values
        1.001_464_8,
        6.0e-8,
        -3.0e-5,
        65_504.0,
        65_520.0, // rounds to infinity
        1.0e9,
        -1.0e9,
        f32::INFINITY,
    ]);
    let want: Vec<f16> = src.iter().map(|&x| f16::from_f32(x)).collect();
    type Convert = unsafe fn(&[f32], &mut [f16]);
    let simd: [(bool, Convert); 2] = [
        (is_x86_feature_detected!("avx512f"), f16_avx512),
        (is_x86_feature_detected!("avx2"), f16_avx2),
    ];
    for (_, f) in simd.into_iter().filter(|(ok, _)| *ok) {
        for len in [src.len(), 7, 13, 0] {
            let mut got = vec![f16::ZERO; len];
            // SAFETY: the CPU has the features checked above (F16C comes with both).
            unsafe { f(&src[..len], &mut got) };
            let bits = |v: &[f16]| v.iter().map(|h| h.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want[..len]));
        }
    }
}

/// Rows of `n` slots × `heads` × `hd` of distinct values.
fn rows(n: usize, heads: usize, hd: usize, seed: f32) -> Vec<f32> {
    (0..n * heads * hd)
        .map(|i| (i as f32 * 0.37 + seed).sin() * 3.0)
        .collect()
}

/// A paged cache takes pages as it grows and gives them back as it truncates and drops; a
/// clone shares them until either writes; trimming the pool's free pages (their memory given
/// back to the system) leaves the pages in use as they were, for every element type.
#[test]
fn pages_come_and_go_and_trim_spares_the_used_ones() {
    for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0] {
        let (layers, heads, hd) = (2, 3, 64);
        // 4096-byte pages of memory span several KV pages here, so trim has whole ones to free.
        let pool = PagePool::new(layers, heads, hd, 64, dtype).unwrap();
        let mut filler = KvCache::paged(&pool, 1024);
        filler.reserve(40 * KV_TILE).unwrap();
        let mut kv = KvCache::paged(&pool, 200);
        let (k, v) = (rows(50, heads, hd, 1.0), rows(50, heads, hd, 2.0));
        kv.reserve(50).unwrap();
        for li in 0..layers {
            kv.write(li, 0, &k, &v);
        }
        assert_eq!((kv.own_pages(), pool.free_pages()), (4, 20));
        let want: Vec<_> = (0..50).map(|s| read(&kv, 1, 2, s)).collect();
        drop(filler);
        assert_eq!(pool.free_pages(), 60);
        pool.trim();
        for (s, w) in want.iter().enumerate() {
            assert_eq!(&read(&kv, 1, 2, s), w, "{dtype} slot {s} after trim");
        }
        // A clone shares the pages; a write past the shared part copies the partial page.
        let mut twin = kv.clone();
        assert_eq!(
            (twin.lent_pages(), twin.own_pages(), pool.free_pages()),
            (4, 0, 60)
        );
        twin.reserve(1).unwrap();
        assert_eq!((twin.own_pages(), pool.free_pages()), (1, 59));
        for (s, w) in want.iter().enumerate().skip(48) {
            assert_eq!(&read(&twin, 1, 2, s), w, "{dtype} slot {s} copied");
        }
        twin.write(0, 50, &k[..heads * hd], &v[..heads * hd]);
        assert_eq!(read(&kv, 1, 2, 49), want[49]);
        kv.truncate(17);
        // Page 2 stays (the twin holds it too), page 3 (the twin has its copy) is free.
        assert_eq!((kv.own_pages(), pool.free_pages()), (2, 60));
        drop(twin);
        assert_eq!(pool.free_pages(), 62);
        kv.clear();
        assert_eq!(pool.free_pages(), 64);
    }
}
