//! f32 parity of the tiny random-weight Llama / Qwen2 / Qwen3 models (safetensors F32 / F16 /
//! BF16) and of the tiny Llama as a mixed-type GGUF, against HF transformers (fixtures written
//! by scripts/make_fixtures.py).

mod common;
use common::*;
use paradraft::kv::KvDtype;
use paradraft::model::{self, Batch, Scratch};

/// Both sides compute in f32 from identical weights; only summation order differs.
const TOL: f32 = 2e-4;
/// With an f16 KV cache, keys and values are rounded to 11 significant bits (measured: at most
/// 3.3e-3 on these models).
const TOL_F16_KV: f32 = 1e-2;

/// A q8_0 KV cache: K and V in int8 blocks of 32 with an f16 scale (measured: logits at most
/// 7.2e-2 off on tiny Llama and Qwen3, hidden states 6.8e-2; f16's 3.3e-3).
const TOL_Q8_KV: f32 = 0.15;

/// The q8_0 cache within its tolerance of transformers (the f32 reference), and measurably off
/// it (so the cache really is quantized).
#[test]
fn q8_0_kv_cache_within_tolerance() {
    for name in ["llama", "qwen3"] {
        let worst = check_model_kv(name, KvDtype::Q8_0, TOL_Q8_KV);
        assert!(worst > 1e-3, "{name}: {worst}");
    }
}

fn check_model(name: &str) {
    check_model_kv(name, KvDtype::F32, TOL);
    check_model_kv(name, KvDtype::F16, TOL_F16_KV);
}

/// Checks the model's logits and taps against transformers with a `dtype` cache; returns the
/// largest logit difference.
fn check_model_kv(name: &str, dtype: KvDtype, tol: f32) -> f32 {
    let mut lm = load_tiny(name);
    lm.model.set_kv_dtype(dtype);
    let rp = fixtures()
        .join("tiny")
        .join(name)
        .join("reference.safetensors");
    let (_, input) = read_ref(&rp, "input_ids");
    let (lshape, logits) = read_ref(&rp, "logits");
    let (hshape, hidden) = read_ref(&rp, "hidden");
    let tokens = ids(&input);
    let (t_len, vocab) = (lshape[0], lshape[1]);
    let n_layers = hshape[0];
    let h = hshape[2];
    assert_eq!(vocab, lm.model.config.vocab_size);
    // Taps of every layer but the last (whose HF "hidden state" is after the final norm), in
    // reverse order to check that the concatenation follows the requested order.
    let taps: Vec<usize> = (0..n_layers - 1).rev().collect();
    let mut kv = lm.model.new_kv(64);
    let mut s = Scratch::default();
    let pos = seq_positions(0, tokens.len());
    let out = lm
        .model
        .forward(
            &mut kv,
            &Batch {
                tokens: &tokens,
                positions: &pos,
                mask: None,
            },
            &spec_with_taps(taps.clone()),
            &mut s,
        )
        .unwrap();
    let mut worst = 0f32;
    for t in 0..t_len {
        let want: Vec<f32> = logits[t * vocab..(t + 1) * vocab]
            .iter()
            .map(|&x| x as f32)
            .collect();
        worst = worst.max(max_abs_diff(out.logits_row(t), &want));
    }
    assert!(worst < tol, "{name} {dtype:?} KV: max |Δlogit| = {worst}");
    let mut worst_h = 0f32;
    for t in 0..t_len {
        for (k, &layer) in taps.iter().enumerate() {
            let got = &out.hidden[(t * taps.len() + k) * h..(t * taps.len() + k + 1) * h];
            let off = (layer * t_len + t) * h;
            let want: Vec<f32> = hidden[off..off + h].iter().map(|&x| x as f32).collect();
            worst_h = worst_h.max(max_abs_diff(got, &want));
        }
    }
    assert!(
        worst_h < tol,
        "{name} {dtype:?} KV: max |Δhidden| = {worst_h}"
    );
    eprintln!("{name} {dtype:?} KV: max |Δlogit| {worst:.2e}, max |Δhidden| {worst_h:.2e}");
    worst
}

#[test]
fn tiny_llama_llama3_rope_untied_f32() {
    check_model("llama");
}

#[test]
fn tiny_qwen2_biases_tied_f16() {
    check_model("qwen2");
}

#[test]
fn tiny_qwen3_qk_norm_bf16() {
    check_model("qwen3");
}

/// Gemma 3: q/k norms, norms after attention and MLP, GeGLU, embeddings scaled by √hidden,
/// two sliding layers (window 8 over 42 tokens) with their own RoPE base beside global ones
/// with linear RoPE scaling, and a final logit soft-cap.
#[test]
fn tiny_gemma3_sliding_window_f32() {
    check_model("gemma3");
}

/// Gemma 2: every other layer sliding (window 8), post-norms, GeGLU, scaled embeddings, an
/// attention soft-cap (5, low enough to bite on random weights) and a final one.
#[test]
fn tiny_gemma2_softcaps_and_windows_f32() {
    check_model("gemma2");
}

#[test]
fn tiny_gemma2_gguf_matches_transformers() {
    gguf_matches_transformers("gemma2");
}

/// With a final soft-cap, the top-k the output layer hands out (ids chosen on the raw scores,
/// values capped) is the top-k of the capped full row, and the argmax is the full row's.
#[test]
fn soft_capped_top_k_and_argmax_match_the_full_row() {
    use paradraft::model::{Logits, OutputSpec, Rows};
    let mut lm = load_tiny("gemma2");
    lm.model.set_exact(true);
    assert_eq!(lm.model.config.extras.final_softcap, Some(30.0));
    let rp = fixtures().join("tiny/gemma2/reference.safetensors");
    let tokens = ids(&read_ref(&rp, "input_ids").1);
    let full = run_logits(&lm, &tokens);
    for logits in [Logits::TopK(5), Logits::ArgmaxTop(5), Logits::Argmax] {
        let spec = OutputSpec {
            rows: Rows::All,
            logits,
            taps: vec![],
        };
        let out = run_forward(&lm, &tokens, &spec);
        for (t, row) in full.iter().enumerate() {
            let want = paradraft::runtime::ops::top_k(row, 5);
            if let Some(top) = out.top.get(t) {
                assert_eq!(top.len(), 5);
                for (a, b) in top.iter().zip(&want) {
                    assert_eq!(a.0, b.0, "{logits:?} row {t}");
                    assert!(
                        (a.1 - b.1).abs() < 1e-5,
                        "{logits:?} row {t}: {a:?} vs {b:?}"
                    );
                }
            }
            if let Some(&a) = out.argmax.get(t) {
                assert_eq!(a, want[0].0, "{logits:?} row {t}");
            }
        }
    }
}

/// Gemma 1: GeGLU, scaled embeddings, norms stored as offsets from 1 (HF) or as 1 + w (GGUF).
#[test]
fn tiny_gemma_f32_and_gguf() {
    check_model("gemma");
    gguf_matches_transformers("gemma");
}

/// Phi-3: fused q/k/v and gate/up projections, served to the Llama layer as row ranges.
#[test]
fn tiny_phi3_fused_projections_f32() {
    check_model("phi3");
}

/// The same Phi-3 as a GGUF laid out as llama.cpp writes it (`attn_qkv`, `ffn_up` twice as
/// tall): the same logits as transformers.
#[test]
fn tiny_phi3_gguf_matches_transformers() {
    gguf_matches_transformers("phi3");
}

/// Phi-3 LongRoPE (#60; Phi-3.5-mini's scheme), HF and GGUF: a context within the original
/// length (64) takes the short factors, a larger one the long factors, cos and sin scaled by the
/// attention factor, as transformers computes a sequence of that length.
#[test]
fn tiny_phi3_longrope_short_and_long_contexts() {
    check_model("phi3-longrope");
    gguf_matches_transformers("phi3-longrope");
    let rp = fixtures().join("tiny/phi3-longrope/reference_long.safetensors");
    let (_, input) = read_ref(&rp, "input_ids");
    assert!(input.len() > 64, "past the original context");
    for path in ["tiny/phi3-longrope", "tiny/phi3-longrope.gguf"] {
        let reference = "tiny/phi3-longrope/reference_long.safetensors";
        let (worst, _, _) = gguf_parity(path, reference, true);
        assert!(worst < TOL, "{path} long context: max |Δlogit| = {worst}");
    }
}

/// Qwen2 with `use_sliding_window` (#60): a window of 8 on layers 1 and 2 (from
/// `max_window_layers`), over 42 tokens.
#[test]
fn tiny_qwen2_sliding_window() {
    check_model("qwen2-window");
}

/// Phi-4-mini's scheme (#60): partial rotary embeddings (half of each head rotated, the rest
/// passed through), LongRoPE over the rotated half, tied embeddings; HF and GGUF
/// (`phi3.rope.dimension_count`), short and long contexts.
#[test]
fn tiny_phi4_mini_partial_rotary() {
    check_model("phi4-mini");
    gguf_matches_transformers("phi4-mini");
    for path in ["tiny/phi4-mini", "tiny/phi4-mini.gguf"] {
        let reference = "tiny/phi4-mini/reference_long.safetensors";
        let (worst, _, _) = gguf_parity(path, reference, true);
        assert!(worst < TOL, "{path} long context: max |Δlogit| = {worst}");
    }
}

/// Mixtures of experts (#60): Qwen3-MoE (8 experts, 2 per token, renormalised, q/k norms),
/// Mixtral (4 experts, 2 per token) and Qwen2-MoE (8 experts, 2 per token, not renormalised,
/// q/k/v biases, a gated shared expert), from transformers' per-expert checkpoints and from
/// GGUF files with llama.cpp's stacked expert tensors.
///
/// With an f32 KV cache only: an f16 cache moves router logits by ~1e-3, enough to flip a
/// near-tie between a token's second and third expert on random weights (measured: |Δlogit|
/// 0.79 at one position of the tiny Qwen3-MoE), which is a different computation, not an error.
#[test]
fn tiny_moe_f32() {
    check_model_kv("qwen3moe", KvDtype::F32, TOL);
    check_model_kv("mixtral", KvDtype::F32, TOL);
    check_model_kv("qwen2moe", KvDtype::F32, TOL);
}

#[test]
fn tiny_moe_gguf_match_transformers() {
    gguf_matches_transformers("qwen3moe");
    gguf_matches_transformers("mixtral");
    gguf_matches_transformers("qwen2moe");
}

/// The tiny GGUF `name` on the exact path: its logits within [`TOL`] of transformers'.
fn gguf_matches_transformers(name: &str) {
    let (worst, _, _) = gguf_parity(
        &format!("tiny/{name}.gguf"),
        &format!("tiny/{name}/reference.safetensors"),
        true,
    );
    assert!(worst < TOL, "{name}: max |Δlogit| = {worst}");
}

/// The same Gemma 3 as llama.cpp's converter writes it (RMSNorm weights stored as 1 + w,
/// `gemma3.*` keys, the sliding pattern as flags, a SentencePiece vocabulary without the space
/// prefix): the same logits as transformers.
#[test]
fn tiny_gemma3_gguf_matches_transformers() {
    gguf_matches_transformers("gemma3");
    let lm = model::load(&fixtures().join("tiny/gemma3.gguf")).unwrap();
    let tok = &lm.tokenizer;
    let ids = tok.encode("the cat sat").unwrap();
    assert_eq!(ids[0], lm.tokenizer.bos.unwrap());
    assert_eq!(tok.decode(&ids).unwrap(), "the cat sat");
}

/// Returns (max |Δlogit|, mean |Δlogit|, smallest reference top-1 margin among positions whose
/// argmax differs (∞ if none)) of a tiny GGUF or HF directory (`file`) against its reference
/// logits (`reference`, both under fixtures/), on the exact path or the int8 one.
fn gguf_parity(file: &str, reference: &str, exact: bool) -> (f32, f32, f32) {
    let mut lm = model::load(&fixtures().join(file)).unwrap();
    lm.model.set_exact(exact);
    let rp = fixtures().join(reference);
    let (_, input) = read_ref(&rp, "input_ids");
    let (lshape, logits) = read_ref(&rp, "logits");
    let got = run_logits(&lm, &ids(&input));
    let vocab = lshape[1];
    let (mut worst, mut sum, mut flip_margin) = (0f32, 0f32, f32::INFINITY);
    for (t, row) in got.iter().enumerate() {
        let want: Vec<f32> = logits[t * vocab..(t + 1) * vocab]
            .iter()
            .map(|&x| x as f32)
            .collect();
        worst = worst.max(max_abs_diff(row, &want));
        sum += row
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .sum::<f32>()
            / vocab as f32;
        let top2 = paradraft::runtime::ops::top_k(&want, 2);
        if paradraft::runtime::ops::argmax(row) != top2[0].0 {
            flip_margin = flip_margin.min(top2[0].1 - top2[1].1);
        }
    }
    (worst, sum / got.len() as f32, flip_margin)
}

/// The tiny Llama with a tensor type per projection, and its reference logits.
const LLAMA_QUANT: (&str, &str) = (
    "tiny/llama-quant.gguf",
    "tiny/llama-quant.reference.safetensors",
);

#[test]
fn tiny_llama_mixed_type_gguf() {
    // f32 activations: the GGUF decoding (every block type, permuted q/k, rope_freqs) is exact.
    let (worst, _, _) = gguf_parity(LLAMA_QUANT.0, LLAMA_QUANT.1, true);
    assert!(worst < TOL, "exact path: max |Δlogit| = {worst}");
    // int8 activations (the fast path): close, and the argmax changes only where the reference
    // itself has a near-tie (top-1 margin below twice the worst logit error).
    let (worst, mean, flip_margin) = gguf_parity(LLAMA_QUANT.0, LLAMA_QUANT.1, false);
    eprintln!("int8 path: max |Δlogit| {worst:.3}, mean {mean:.4}, smallest flipped margin {flip_margin:.3}");
    assert!(
        mean < 0.05 && worst < 0.5,
        "int8 path: max {worst}, mean {mean}"
    );
    assert!(
        flip_margin < 2.0 * worst || flip_margin.is_infinite(),
        "argmax flipped at margin {flip_margin}"
    );
}

#[test]
fn tiny_tokenizers_and_templates_match_reference() {
    for name in ["llama", "qwen2", "qwen3"] {
        let lm = load_tiny(name);
        let p = fixtures()
            .join("tiny")
            .join(name)
            .join("reference_text.json");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        let want: Vec<u32> = v["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let text = v["text"].as_str().unwrap();
        let got: Vec<u32> = lm
            .tokenizer
            .encode(text)
            .unwrap()
            .iter()
            .map(|t| t.0)
            .collect();
        assert_eq!(got, want, "{name}");
        let msgs = [model::Message::new(
            "user",
            "Explain why the sky is blue, with numbers 12345.",
        )];
        assert_eq!(lm.tokenizer.apply_chat_template(&msgs, true).unwrap(), text);
        // generation_config's eos list joins the stop set
        assert!(lm.tokenizer.stop_tokens.contains(&paradraft::TokenId(2)));
    }
    let g = model::load(&fixtures().join("tiny/llama-quant.gguf")).unwrap();
    let hf = load_tiny("llama");
    let s = "def f(x):\n    return x ** 2  # café 12345";
    assert_eq!(
        g.tokenizer.encode(s).unwrap(),
        hf.tokenizer.encode(s).unwrap()
    );
    assert_eq!(
        g.tokenizer.decode(&g.tokenizer.encode(s).unwrap()).unwrap(),
        s
    );
}
