//! The attention kernels against an f64 reference, bit for bit against each other, and timed.

use super::*;
use crate::runtime::kv::tests::q8_roundtrip;
use crate::runtime::kv::{KvCache, KvDtype};
use crate::types::Pos;

use crate::runtime::qmatmul::tests::{runnable, Lcg};

/// The vectorised maximum equals the scalar fold, NaNs and empty slices included.
#[test]
fn lane_max_is_the_fold() {
    let mut rng = Lcg(3);
    for n in [0, 1, 5, 16, 17, 40, 333] {
        let mut x: Vec<f32> = (0..n).map(|_| sym(&mut rng) * 50.0).collect();
        if n > 3 {
            x[2] = f32::NAN;
        }
        let want = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(lane_max(&x).to_bits(), want.to_bits(), "n = {n}");
    }
    assert_eq!(lane_max(&[f32::NEG_INFINITY; 20]), f32::NEG_INFINITY);
}

/// Uniform in [−1, 1).
fn sym(rng: &mut Lcg) -> f32 {
    rng.unif() * 2.0 - 1.0
}

/// A random attention call: its shape (heads, KV heads, head size; `prefix` cached and
/// `n_new` new tokens), then K and V for every slot and the new tokens' queries, K and Q
/// uniform in ±`kq`, V in ±1.
fn case(
    rng: &mut Lcg,
    (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
    prefix: usize,
    n_new: usize,
    kq: f32,
) -> (AttnShape, Vec<f32>, Vec<f32>, Vec<f32>) {
    let s = AttnShape {
        n_heads,
        n_kv_heads,
        head_dim,
        prefix,
        n_new,
    };
    let cache = (prefix + n_new) * n_kv_heads * head_dim;
    let k = (0..cache).map(|_| sym(rng) * kq).collect();
    let v = (0..cache).map(|_| sym(rng)).collect();
    let q = (0..n_new * n_heads * head_dim)
        .map(|_| sym(rng) * kq)
        .collect();
    (s, k, v, q)
}

/// f64 softmax attention, straight from the definition.
fn reference(q: &[f32], k: &[f32], v: &[f32], s: &AttnShape, mask: &[bool]) -> Vec<f32> {
    reference_rule(q, k, v, s, mask, Rule::plain(s.head_dim))
}

/// The same with a score scale and a sliding window: slot j (prefix slot j at position j, new
/// token j at `positions[j]`) is seen from position p when p − pos(j) < size.
fn reference_rule(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    s: &AttnShape,
    mask: &[bool],
    rule: Rule,
) -> Vec<f32> {
    let (hd, group) = (s.head_dim, s.n_heads / s.n_kv_heads);
    let row = s.n_kv_heads * hd;
    let mut out = vec![0f32; q.len()];
    for t in 0..s.n_new {
        let pos = |slot: usize| match rule.window {
            Some(w) if slot >= s.prefix => w.positions[slot - s.prefix].0 as i64,
            _ => slot as i64,
        };
        let near = |slot: usize| match rule.window {
            Some(w) => pos(s.prefix + t) - pos(slot) < w.size as i64,
            None => true,
        };
        let seen: Vec<usize> = (0..s.prefix)
            .chain(
                (0..s.n_new)
                    .filter(|&j| mask[t * s.n_new + j])
                    .map(|j| s.prefix + j),
            )
            .filter(|&sl| near(sl))
            .collect();
        for h in 0..s.n_heads {
            let g = h / group;
            let qh = &q[(t * s.n_heads + h) * hd..][..hd];
            let sc: Vec<f64> = seen
                .iter()
                .map(|&sl| {
                    let kr = &k[sl * row + g * hd..][..hd];
                    qh.iter()
                        .zip(kr)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * rule.scale as f64
                })
                .collect();
            let sc: Vec<f64> = match rule.softcap {
                Some(c) => sc
                    .iter()
                    .map(|&x| c as f64 * (x / c as f64).tanh())
                    .collect(),
                None => sc,
            };
            let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..hd {
                let o: f64 = seen
                    .iter()
                    .zip(&e)
                    .map(|(&sl, &w)| w * v[sl * row + g * hd + d] as f64)
                    .sum();
                out[(t * s.n_heads + h) * hd + d] = (o / z) as f32;
            }
        }
    }
    out
}

/// Every kernel against the f64 reference (max abs error 2e-5 on unit-scale values), on
/// prefixes that are and are not multiples of the tile and the slot range, causal and tree
/// masks, GQA groups of 1, 3 and 4, head sizes 16, 64, 80 (AVX-512: multiples of 16 only;
/// AVX2 also 8; portable also 20); and a token's output has the same bits whichever tokens
/// share its work units.
#[test]
fn kernels_match_reference() {
    crate::runtime::init_threads(2);
    let mut rng = Lcg(7);
    for &(n_heads, n_kv, hd) in &[(4, 4, 16), (9, 3, 64), (8, 2, 80), (4, 1, 8), (6, 2, 20)] {
        for &(prefix, n_new) in &[(0, 1), (5, 3), (37, 16), (130, 9), (255, 2), (300, 1)] {
            for tree in [false, true] {
                let (s, k, v, q) = case(&mut rng, (n_heads, n_kv, hd), prefix, n_new, 2.0);
                let total = prefix + n_new;
                // A tree: node i's parent is (i − 1) / 2.
                let mut mask = vec![false; n_new * n_new];
                for i in 0..n_new {
                    let mut j = Some(i);
                    while let Some(x) = j {
                        mask[i * n_new + x] = true;
                        j = if !tree {
                            x.checked_sub(1)
                        } else if x == 0 {
                            None
                        } else {
                            Some((x - 1) / 2)
                        };
                    }
                }
                let vis = Visibility::Mask(&mask);
                // Every kernel this CPU runs for this head size.
                let mut kerns: Vec<Kernel> =
                    runnable().into_iter().map(|i| kernel_of(i, hd)).collect();
                kerns.dedup();
                let dtypes = [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0];
                for (kern, dtype) in kerns.into_iter().flat_map(|k| dtypes.map(|d| (k, d))) {
                    let mut kv = KvCache::with_dtype(1, n_kv, hd, total + 3, dtype);
                    kv.write(0, 0, &k, &v);
                    // The reference sees what the cache holds (f16-rounded K/V for f16, each
                    // head's row through llama.cpp's Q8_0 quantiser and back for q8_0).
                    let round = |x: &Vec<f32>| -> Vec<f32> {
                        match dtype {
                            KvDtype::F32 => x.clone(),
                            KvDtype::F16 => x.iter().map(|&y| f16::from_f32(y).to_f32()).collect(),
                            KvDtype::Q8_0 => x.chunks(hd).flat_map(q8_roundtrip).collect(),
                        }
                    };
                    let (rk, rv) = (round(&k), round(&v));
                    let want = reference(&q, &rk, &rv, &s, &mask);
                    let mut out = vec![0f32; q.len()];
                    attention_kern(
                        kern,
                        TOKEN_BLOCK,
                        &q,
                        kv.layer(0),
                        &s,
                        vis,
                        Rule::plain(hd),
                        &mut out,
                    );
                    let err = out
                        .iter()
                        .zip(&want)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    assert!(err < 2e-5, "{kern:?} {dtype:?} heads {n_heads}/{n_kv} hd {hd} prefix {prefix} new {n_new} tree {tree}: {err}");
                    // A scaled cache computes with exactly its dequantized values: the bits of
                    // an f32 cache holding them.
                    if dtype == KvDtype::Q8_0 {
                        let mut f = KvCache::with_dtype(1, n_kv, hd, total + 3, KvDtype::F32);
                        f.write(0, 0, &rk, &rv);
                        let mut same = vec![0f32; q.len()];
                        let r = Rule::plain(hd);
                        attention_kern(kern, TOKEN_BLOCK, &q, f.layer(0), &s, vis, r, &mut same);
                        assert!(
                            same.iter()
                                .zip(&out)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{kern:?} q8_0 hd {hd} prefix {prefix} new {n_new}: not the f32 bits"
                        );
                    }
                    if !tree {
                        let mut causal = vec![0f32; q.len()];
                        attention_kern(
                            kern,
                            TOKEN_BLOCK,
                            &q,
                            kv.layer(0),
                            &s,
                            Visibility::Causal,
                            Rule::plain(hd),
                            &mut causal,
                        );
                        assert_eq!(causal, out, "Causal and its explicit mask differ");
                    }
                    // Each token alone in its units: the same bits as in blocks of
                    // TOKEN_BLOCK (and of 3, which leaves other remainders).
                    for tb in [1, 3] {
                        let mut alone = vec![0f32; q.len()];
                        attention_kern(
                            kern,
                            tb,
                            &q,
                            kv.layer(0),
                            &s,
                            vis,
                            Rule::plain(hd),
                            &mut alone,
                        );
                        let same = alone
                            .iter()
                            .zip(&out)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{kern:?} {dtype:?} heads {n_heads}/{n_kv} hd {hd} prefix {prefix} new {n_new} tree {tree}: blocks of {tb} differ");
                    }
                }
            }
        }
    }
}

/// Time of attention over 30 layers' caches in SmolLM2-135M's geometry (9 heads, 3 KV
/// heads, head size 64; an f16 cache, or `KV_DTYPE`'s) for cached prefixes and new-token counts, and the K/V
/// bytes it reads per second (run with `--ignored --nocapture`; 2 threads).
#[test]
#[ignore]
fn attention_timing() {
    crate::runtime::init_threads(2);
    let mut rng = Lcg(9);
    let (n_heads, n_kv, hd) = (9, 3, 64);
    let dtype: KvDtype = std::env::var("KV_DTYPE").map_or(KvDtype::F16, |s| s.parse().unwrap());
    for prefix in [64, 640, 4000] {
        for n_new in [1, 4, 16] {
            let (s, k, v, q) = case(&mut rng, (n_heads, n_kv, hd), prefix, n_new, 1.0);
            let total = prefix + n_new;
            // 30 layers' caches, as a forward reads them one after the other.
            let mut kv = KvCache::with_dtype(30, n_kv, hd, total, dtype);
            for l in 0..30 {
                kv.write(l, 0, &k, &v);
            }
            let mut out = vec![0f32; q.len()];
            let reps = 20;
            let dt = (0..5)
                .map(|_| {
                    let t = std::time::Instant::now();
                    for _ in 0..reps {
                        for l in 0..30 {
                            let job = AttnJob {
                                q: &q,
                                kv: kv.layer(l),
                                s: &s,
                                vis: Visibility::Causal,
                                rule: Rule::plain(s.head_dim),
                                out: &mut out,
                            };
                            attention_many(&mut [job]);
                        }
                    }
                    t.elapsed().as_secs_f64() / reps as f64
                })
                .fold(f64::INFINITY, f64::min);
            let bytes = 30.0 * (n_new * (prefix + n_new) * 2 * n_kv * dtype.row_bytes(hd)) as f64;
            eprintln!(
                "{dtype} prefix {prefix} new {n_new}: {:.3} ms for 30 layers, {:.1} GB/s of K/V per row",
                dt * 1e3,
                bytes / dt / 1e9
            );
        }
    }
}

/// Sliding windows (Gemma, Mistral): every kernel against the f64 reference with windows
/// narrower and wider than the prefix and the new tokens, a chain and a tree whose nodes share
/// positions by depth, and a score scale other than 1/√head_dim; a token's bits do not depend
/// on the tokens sharing its work units, and a window wider than every distance changes nothing.
#[test]
fn windowed_attention_matches_reference() {
    crate::runtime::init_threads(2);
    let mut rng = Lcg(11);
    let hd = 16;
    for &(prefix, n_new) in &[(0, 5), (37, 16), (300, 7)] {
        for size in [1, 3, 16, 130, 100_000] {
            for tree in [false, true] {
                let (s, k, v, q) = case(&mut rng, (4, 2, hd), prefix, n_new, 2.0);
                // Chain: position prefix + i. Tree: node i's parent (i − 1) / 2, depth by parent.
                let parent = |i: usize| if tree { (i - 1) / 2 } else { i - 1 };
                let mut mask = vec![false; n_new * n_new];
                let mut depth = vec![0u32; n_new];
                for i in 0..n_new {
                    if i > 0 {
                        depth[i] = depth[parent(i)] + 1;
                    }
                    let mut j = Some(i);
                    while let Some(x) = j {
                        mask[i * n_new + x] = true;
                        j = (x > 0).then(|| parent(x));
                    }
                }
                let positions: Vec<Pos> = depth.iter().map(|&d| Pos(prefix as u32 + d)).collect();
                let rule = Rule {
                    scale: 0.37,
                    // Gemma 2's attention soft-cap on half the cases (scores up to ~4.7 here).
                    softcap: (size % 2 == 1).then_some(2.0),
                    window: Some(Window {
                        size,
                        positions: &positions,
                    }),
                };
                let want = reference_rule(&q, &k, &v, &s, &mask, rule);
                let mut kerns: Vec<Kernel> =
                    runnable().into_iter().map(|i| kernel_of(i, hd)).collect();
                kerns.dedup();
                for kern in kerns {
                    let mut kv = KvCache::with_dtype(1, 2, hd, prefix + n_new, KvDtype::F32);
                    kv.write(0, 0, &k, &v);
                    let vis = if tree {
                        Visibility::Mask(&mask)
                    } else {
                        Visibility::Causal
                    };
                    let mut outs = vec![];
                    for tb in [TOKEN_BLOCK, 1, 3] {
                        let mut out = vec![0f32; q.len()];
                        attention_kern(kern, tb, &q, kv.layer(0), &s, vis, rule, &mut out);
                        outs.push(out);
                    }
                    let err = outs[0]
                        .iter()
                        .zip(&want)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    let case =
                        format!("{kern:?} prefix {prefix} new {n_new} window {size} tree {tree}");
                    assert!(err < 2e-5, "{case}: {err}");
                    assert!(
                        outs[1..].iter().all(|o| o == &outs[0]),
                        "{case}: blocks differ"
                    );
                    if size == 100_000 {
                        let mut plain = vec![0f32; q.len()];
                        let r = Rule {
                            window: None,
                            ..rule
                        };
                        attention_kern(kern, TOKEN_BLOCK, &q, kv.layer(0), &s, vis, r, &mut plain);
                        assert_eq!(plain, outs[0], "{case}: a window past every distance");
                    }
                }
            }
        }
    }
}
