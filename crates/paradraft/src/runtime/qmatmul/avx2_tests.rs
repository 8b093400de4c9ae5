//! Tests and timings of the 256-bit kernels' tile shapes.

use super::*;
use crate::runtime::ggml::GgmlType;

/// Times AVX2 kernel variants on `ty` weights of `rows` × 576 for each activation row
/// count in `ns`, interleaved over ten rounds, and prints each variant's median and best
/// GMAC/s (one core).
fn time_variants(
    label: &str,
    variants: &[(&str, GroupsFn)],
    ty: GgmlType,
    rows: usize,
    ns: &[usize],
) {
    let cols = 576;
    let src: Vec<u8> = (0..rows * ty.row_bytes(cols))
        .map(|i| (i * 37 % 251) as u8 & 0x3F)
        .collect();
    let p = Packed::new(ty, rows, cols, &src);
    for &n in ns {
        let x: Vec<f32> = (0..n * cols).map(|i| (i % 17) as f32 - 8.0).collect();
        let mut qa = QActs::default();
        qa.quantize(&x, cols);
        let mut out = vec![0f32; n * rows];
        let reps = 4000 / n * 1536 / rows + 3;
        let mut rates = vec![vec![]; variants.len()];
        for it in 0..10 * variants.len() {
            let v = it % variants.len();
            let t = std::time::Instant::now();
            for _ in 0..reps {
                unsafe { variants[v].1(&p, &qa, 0, p.groups(), out.as_mut_ptr(), rows) };
            }
            let dt = t.elapsed().as_secs_f64() / reps as f64;
            rates[v].push((rows * cols * n) as f64 / dt / 1e9);
        }
        let line: Vec<String> = variants
            .iter()
            .zip(&mut rates)
            .map(|((name, _), r)| {
                r.sort_by(f64::total_cmp);
                format!(
                    "{name}: median {:.1} max {:.1}",
                    r[r.len() / 2],
                    r[r.len() - 1]
                )
            })
            .collect();
        eprintln!(
            "{label} {ty:?} {rows}×{cols} n={n} GMAC/s: {}",
            line.join(" | ")
        );
    }
}

/// The numbers behind [`MADDUBS_TILE`] and [`WIDE_ROWS`]: tiles of at most 4, 8 and 16
/// rows at 4–16 rows, and one half against both halves of a group at 2–3 rows:
/// `cargo test --release -p paradraft --lib tile_shapes -- --ignored --nocapture`.
#[test]
#[ignore]
fn tile_shapes() {
    if !std::is_x86_feature_detected!("avx2") {
        return;
    }
    let heights: [(&str, GroupsFn); 3] = [
        ("tile 4", groups_avx2::<4, 1>),
        ("tile 8", groups_avx2::<8, 1>),
        ("tile 16", groups_avx2::<16, 1>),
    ];
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        time_variants("heights", &heights, ty, 1536, &[4, 8, 16]);
    }
    let halves: [(&str, GroupsFn); 2] = [
        ("one half", groups_avx2::<4, 1>),
        ("both halves", groups_avx2::<4, 3>),
    ];
    for (ty, rows) in [
        (GgmlType::Q4_1, 1536),
        (GgmlType::Q4_1, 49152),
        (GgmlType::Q8_0, 49152),
    ] {
        time_variants("halves", &halves, ty, rows, &[2, 3]);
    }
}

/// Every tile height, and tiles over both halves of a group, give every row the same bits
/// (a row's sums and epilogue do not depend on the tile it is computed in).
#[test]
fn tile_heights_give_the_same_bits() {
    if !std::is_x86_feature_detected!("avx2") {
        return;
    }
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        let (rows, cols) = (40, 96);
        let src: Vec<u8> = (0..rows * ty.row_bytes(cols))
            .map(|i| (i * 61 % 241) as u8 & 0x3F) // finite f16 scales
            .collect();
        let p = Packed::new(ty, rows, cols, &src);
        for n in [2, 3, 5, 13, 16, 21] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 7) % 23) as f32 - 11.0)
                .collect();
            let mut qa = QActs::default();
            qa.quantize(&x, cols);
            let run = |f: GroupsFn| {
                let mut out = vec![0f32; n * rows];
                unsafe { f(&p, &qa, 0, p.groups(), out.as_mut_ptr(), rows) };
                assert!(out.iter().all(|v| v.is_finite()));
                out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
            };
            let want = run(groups_avx2::<4, 1>);
            assert_eq!(run(groups_avx2::<8, 1>), want, "{ty:?} n={n} tile 8");
            assert_eq!(run(groups_avx2::<16, 1>), want, "{ty:?} n={n} tile 16");
            assert_eq!(run(groups_avx2::<4, 3>), want, "{ty:?} n={n} both halves");
        }
    }
}

/// The AVX2 kernel with tiles of at most `TILE` rows.
type GroupsFn = unsafe fn(&Packed, &QActs, usize, usize, *mut f32, usize);

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups_avx2<const TILE: usize, const WIDE: usize>(
    p: &Packed,
    a: &QActs,
    g0: usize,
    g1: usize,
    out: *mut f32,
    ld: usize,
) {
    groups::<Maddubs, TILE, WIDE>(p, a, g0, g1, out, ld)
}
