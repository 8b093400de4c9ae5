//! Every quantized GGML type against an independent implementation: random blocks and their
//! dequantisation by the `gguf` Python package (`scripts/make_quant_fixtures.py` wrote
//! `fixtures/quants/blocks.gguf`), bit for bit in f32; the repacked matrices dequantise to the
//! same bits, and their int8 matmuls stay within the activation-quantization bound of the exact
//! product.

use paradraft::generate::{generate, top_logits, GenerateParams};
use paradraft::model::gguf::GgufFile;
use paradraft::runtime::ggml::GgmlType;
use paradraft::runtime::qmatmul::QActs;
use paradraft::runtime::quant::{dequantize, Matrix};
use paradraft::types::TokenId;
use std::path::Path;

fn fixture() -> GgufFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/quants/blocks.gguf");
    GgufFile::open(&path).expect("fixtures/quants/blocks.gguf")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// (type, raw bytes, rows, cols, gguf-py's f32 values).
type Case = (GgmlType, Vec<u8>, usize, usize, Vec<f32>);

/// One [`Case`] for every quantized type in the fixture.
fn cases(f: &GgufFile) -> Vec<Case> {
    let mut out = Vec::new();
    for ty in GgmlType::ALL.into_iter().filter(|t| !t.is_dense()) {
        let q = &f.tensors[&format!("{}.q", ty.name())];
        let r = &f.tensors[&format!("{}.f32", ty.name())];
        assert_eq!(q.dtype, ty);
        assert_eq!(r.dtype, GgmlType::F32);
        let (cols, rows) = (q.dims[0], q.dims[1]);
        let want: Vec<f32> = f
            .data(r)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        out.push((ty, f.data(q).to_vec(), rows, cols, want));
    }
    out
}

#[test]
fn fixture_covers_every_quantized_type() {
    let f = fixture();
    let n = cases(&f).len();
    let quantized = GgmlType::ALL.iter().filter(|t| !t.is_dense()).count();
    assert_eq!(n, quantized);
    assert!(n >= 12, "Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K..Q6_K IQ4_NL IQ4_XS");
}

#[test]
fn dequantization_is_ggml_bit_for_bit() {
    let f = fixture();
    for (ty, raw, rows, cols, want) in cases(&f) {
        let mut got = vec![0f32; rows * cols];
        dequantize(ty, &raw, &mut got);
        let (g, w) = (bits(&got), bits(&want));
        if let Some(i) = (0..g.len()).find(|&i| g[i] != w[i]) {
            panic!("{ty:?} element {i}: {} vs gguf-py {}", got[i], want[i]);
        }
    }
}

#[test]
fn repacked_rows_are_ggml_bit_for_bit() {
    let f = fixture();
    for (ty, raw, rows, cols, want) in cases(&f) {
        let m = Matrix::from_bytes(ty, rows, cols, &raw);
        assert_eq!(m.ty(), ty);
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            m.row_into(r, &mut row);
            assert_eq!(
                bits(&row),
                bits(&want[r * cols..(r + 1) * cols]),
                "{ty:?} row {r}"
            );
        }
        // A subset of rows, in another order, is the same bits.
        let pick = [rows - 1, 0, 2];
        let sub = m.select_rows(&pick);
        for (i, &r) in pick.iter().enumerate() {
            sub.row_into(i, &mut row);
            assert_eq!(bits(&row), bits(&want[r * cols..(r + 1) * cols]), "{ty:?}");
        }
    }
}

#[test]
fn int8_matmuls_stay_within_the_activation_bound() {
    let f = fixture();
    for (ty, raw, rows, cols, w) in cases(&f) {
        let m = Matrix::from_bytes(ty, rows, cols, &raw);
        for n in [1, 3, 7] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 4.0)
                .collect();
            let mut qa = QActs::default();
            qa.quantize(&x, cols);
            let mut out = vec![0f32; n * rows];
            m.matmul(&x, &qa, &mut out);
            // The same rows one at a time give the same bits (batch invariance).
            for t in 0..n {
                let mut one = vec![0f32; rows];
                let mut q1 = QActs::default();
                q1.quantize(&x[t * cols..(t + 1) * cols], cols);
                m.matmul(&x[t * cols..(t + 1) * cols], &q1, &mut one);
                assert_eq!(
                    bits(&one),
                    bits(&out[t * rows..(t + 1) * rows]),
                    "{ty:?} n{n}"
                );
            }
            for t in 0..n {
                let xr = &x[t * cols..(t + 1) * cols];
                for r in 0..rows {
                    let wr = &w[r * cols..(r + 1) * cols];
                    let exact: f64 = wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let mag: f64 = wr
                        .iter()
                        .zip(xr)
                        .map(|(a, b)| (*a as f64 * *b as f64).abs())
                        .sum();
                    // |x − d·q| ≤ d/2 with d = amax/127 per 32 activations.
                    let bound: f64 = (0..cols)
                        .map(|i| {
                            let b = i / 32;
                            let amax = xr[b * 32..(b + 1) * 32]
                                .iter()
                                .fold(0f32, |a, v| a.max(v.abs()));
                            wr[i].abs() as f64 * amax as f64 / 254.0
                        })
                        .sum();
                    let got = out[t * rows + r] as f64;
                    assert!(
                        (got - exact).abs() <= bound * 1.001 + 1e-4 * mag + 1e-6,
                        "{ty:?} n{n} row {r}: {got} vs exact {exact} (bound {bound})"
                    );
                }
            }
        }
    }
}

/// The tiny Llama whose tensors mix every K-quant and the other block types.
/// Positions where two runs' top-1 tokens agree.
fn top1_agreement(a: &[Vec<(TokenId, f32)>], b: &[Vec<(TokenId, f32)>]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x[0].0 == y[0].0).count()
}

fn tiny_kquant() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/quants/tiny-kquant.gguf")
}

#[test]
fn a_model_mixing_every_type_runs_and_its_fast_path_tracks_the_exact_one() {
    let mut lm = paradraft::model::load(&tiny_kquant()).expect("tiny-kquant.gguf loads");
    let ids = lm
        .tokenizer
        .encode("Once upon a time there was a little robot who wanted to see the sea.")
        .unwrap();
    let fast = top_logits(&lm.model, &ids, 1).unwrap();
    lm.model.set_exact(true);
    let exact = top_logits(&lm.model, &ids, 1).unwrap();
    let agree = top1_agreement(&fast, &exact);
    // Int8 activations move logits a little: the argmax holds at nearly every position.
    assert!(
        agree * 10 >= ids.len() * 8,
        "{agree} of {} positions agree",
        ids.len()
    );
    for (a, b) in fast.iter().zip(&exact) {
        assert!(
            a[0].1.is_finite() && (a[0].1 - b[0].1).abs() < 0.25,
            "{a:?} {b:?}"
        );
    }
}

fn greedy(n: usize) -> GenerateParams {
    GenerateParams {
        max_new_tokens: n,
        sampling: Default::default(),
        stop_strings: vec![],
        ..Default::default()
    }
}

/// Deterministic mutations of the file: each either loads (and then generates without a
/// panic) or fails with an error.
#[test]
fn mutated_k_quant_files_error_or_run_never_panic() {
    fuzz(&tiny_kquant(), 300);
}

/// The same over Gemma 3's file: its `gemma3.*` keys (window, sliding pattern, RoPE base of the
/// sliding layers, soft-cap) and its SentencePiece vocabulary (pieces, scores, types).
#[test]
fn mutated_gemma3_files_error_or_run_never_panic() {
    fuzz(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/gemma3.gguf"),
        200,
    );
}

/// The same over Qwen2-MoE's file: its `qwen2moe.expert_*` keys (experts, experts per token,
/// expert and shared-expert widths) and the stacked and shared expert tensors.
#[test]
fn mutated_qwen2moe_files_error_or_run_never_panic() {
    fuzz(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/qwen2moe.gguf"),
        200,
    );
}

fn fuzz(file: &std::path::Path, rounds: usize) {
    let src = std::fs::read(file).unwrap();
    let td = tempfile::tempdir().unwrap();
    let p = td.path().join("m.gguf");
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let (mut loaded, mut refused) = (0, 0);
    for round in 0..rounds {
        let mut b = src.clone();
        // Half the rounds hit the header and tensor table, half anywhere.
        let span = if round % 2 == 0 {
            12_000.min(b.len())
        } else {
            b.len()
        };
        for _ in 0..1 + next(6) {
            let at = next(span);
            b[at] = next(256) as u8;
        }
        if round % 10 == 0 {
            b.truncate(next(b.len()));
        }
        std::fs::write(&p, &b).unwrap();
        match paradraft::model::load(&p) {
            Ok(lm) => {
                loaded += 1;
                let mut kv = lm.model.new_kv(32);
                let params = greedy(3);
                let ids = [paradraft::types::TokenId(1), paradraft::types::TokenId(5)];
                let _ = generate(&lm.model, &lm.tokenizer, &mut kv, &ids, &params, |_| {});
                let _ = lm
                    .tokenizer
                    .encode("a <s> text\n  with  spaces <|im_end|> 12");
            }
            Err(e) => {
                refused += 1;
                assert!(!e.to_string().is_empty());
            }
        }
    }
    assert!(
        loaded > 0 && refused > 0,
        "loaded {loaded}, refused {refused}"
    );
}

/// `--quantize` (#59): a dense model's matrices converted at load to Q8_0, Q4_0, Q4_1, Q4_K or
/// Q6_K run on
/// the int8 kernels and stay near the unquantized model (Q8_0 closely, 4-bit less so); the
/// embedding and LM head keep 8 bits under a 4-bit type.
#[test]
fn dense_models_quantized_at_load_track_the_unquantized_one() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/llama");
    let lm = paradraft::model::load(&path).expect("tiny llama loads");
    let ids = lm
        .tokenizer
        .encode("Once upon a time there was a little robot who wanted to see the sea.")
        .unwrap();
    let dense = top_logits(&lm.model, &ids, 1).unwrap();
    // Random weights give thin margins: a 4-bit model's argmax moves at many positions, its
    // logits stay near (the real model's figures are in docs/gguf.md).
    for (ty, agree_at_least, tol) in [
        (GgmlType::Q8_0, 0.9, 0.05),
        (GgmlType::Q4_0, 0.3, 0.3),
        (GgmlType::Q4_1, 0.3, 0.3),
        // 64-wide rows: Q4_K falls back to Q5_0 and its Q6_K embedding to Q8_0, as
        // llama-quantize's do (the K-quant blocks themselves: `runtime::kquantize`).
        (GgmlType::Q4_K, 0.3, 0.3),
        (GgmlType::Q6_K, 0.9, 0.05),
    ] {
        let mut q = paradraft::model::load(&path).unwrap();
        q.model.quantize_dense(ty);
        let got = top_logits(&q.model, &ids, 1).unwrap();
        let agree = top1_agreement(&got, &dense);
        eprintln!("{ty:?}: top-1 {agree} of {}", ids.len());
        assert!(
            agree as f64 >= agree_at_least * ids.len() as f64,
            "{ty:?}: {agree} of {} positions agree",
            ids.len()
        );
        let worst = got
            .iter()
            .zip(&dense)
            .map(|(a, b)| (a[0].1 - b[0].1).abs())
            .fold(0f32, f32::max);
        let scale = dense.iter().map(|d| d[0].1.abs()).fold(0f32, f32::max);
        eprintln!("{ty:?}: worst |Δ| {worst} (scale {scale})");
        assert!(
            worst <= tol * scale.max(1.0),
            "{ty:?}: |Δ| {worst} (scale {scale})"
        );
        assert!(got != dense, "{ty:?}: nothing was quantized");
    }
    // A mixture of experts: its experts quantized, its router kept as stored.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/qwen3moe");
    let lm = paradraft::model::load(&path).unwrap();
    let dense = top_logits(&lm.model, &ids, 1).unwrap();
    let mut q = paradraft::model::load(&path).unwrap();
    q.model.quantize_dense(GgmlType::Q8_0);
    let got = top_logits(&q.model, &ids, 1).unwrap();
    let agree = top1_agreement(&got, &dense);
    eprintln!("qwen3moe Q8_0: top-1 {agree} of {}", ids.len());
    assert!(agree * 10 >= ids.len() * 8, "{agree} of {}", ids.len());
}
