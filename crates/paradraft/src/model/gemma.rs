//! Gemma 3 (text): what its GGUF metadata and its HF `config.json` say beyond the Llama keys.
//! The layers are the shared decoder layer with Gemma's pieces switched on ([`Extras`]): q/k
//! RMSNorm, RMSNorms after attention and after the MLP, GeGLU (tanh GELU), embeddings scaled
//! by √hidden, sliding-window layers (five of six by default) with their own RoPE base (10,000;
//! RoPE scaling applies to the global layers only), and an optional final logit soft-cap.
//! Gemma's HF checkpoints store RMSNorm weights as offsets from 1; its GGUF files store 1 + w.

use super::config::{Activation, Extras, SlidingWindow};
use super::gguf::{GgufFile, Value};
use crate::error::{Error, Result};

/// llama.cpp's defaults for Gemma 3 files that leave them out.
const PATTERN: usize = 6;
const LOCAL_THETA: f64 = 10_000.0;

/// The attention scale: 1/√head_dim, except Gemma 3 27B's 1/√(hidden / heads), which
/// llama.cpp recognises by its 62 layers (HF configs carry `query_pre_attn_scalar`).
fn gguf_attn_scale(n_layers: usize, hidden: usize, n_heads: usize, head_dim: usize) -> f32 {
    let d = if n_layers == 62 {
        hidden / n_heads.max(1)
    } else {
        head_dim
    };
    1.0 / (d as f32).sqrt()
}

/// Layer `il` of a pattern of `n` slides unless it is the pattern's last.
fn pattern_layers(n_layers: usize, n: usize) -> Vec<bool> {
    (0..n_layers).map(|il| n == 0 || il % n < n - 1).collect()
}

pub(crate) fn gguf_extras(
    g: &GgufFile,
    (n_layers, hidden, n_heads, head_dim): (usize, usize, usize, usize),
) -> Result<Extras> {
    let key = |k: &str| format!("gemma3.{k}");
    let sliding_window = match g.u64(&key("attention.sliding_window")).unwrap_or(0) {
        0 => None,
        size => {
            let layers = match g.get(&key("attention.sliding_window_pattern")) {
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_bool().or(v.as_u64().map(|x| x != 0)))
                    .collect::<Option<Vec<bool>>>()
                    .ok_or_else(|| {
                        Error::Unsupported("gemma3 sliding_window_pattern holds non-flags".into())
                    })?,
                Some(v) => pattern_layers(n_layers, v.as_u64().unwrap_or(PATTERN as u64) as usize),
                None => pattern_layers(n_layers, PATTERN),
            };
            Some(SlidingWindow {
                size: size as usize,
                layers,
                rope_theta: Some(g.f64(&key("rope.freq_base_swa")).unwrap_or(LOCAL_THETA) as f32),
            })
        }
    };
    Ok(Extras {
        activation: Activation::GeluTanh,
        post_norms: true,
        embed_scale: Some((hidden as f32).sqrt()),
        attn_scale: Some(gguf_attn_scale(n_layers, hidden, n_heads, head_dim)),
        sliding_window,
        final_softcap: g
            .f64(&key("final_logit_softcapping"))
            .filter(|&c| c != 0.0)
            .map(|c| c as f32),
        norm_plus_one: false,
    })
}

/// The extras of an HF `gemma3_text` config (`v`) with `n_layers` layers and `hidden` width.
pub(crate) fn hf_extras(v: &serde_json::Value, n_layers: usize, hidden: usize) -> Result<Extras> {
    if !v["attn_logit_softcapping"].is_null() {
        return Err(Error::Unsupported(
            "attention logit soft-capping (Gemma 2); Gemma 3 has none".into(),
        ));
    }
    match v["hidden_activation"]
        .as_str()
        .or(v["hidden_act"].as_str())
        .unwrap_or("gelu_pytorch_tanh")
    {
        "gelu_pytorch_tanh" | "gelu_tanh" => {}
        other => {
            return Err(Error::Unsupported(format!(
                "Gemma activation {other:?} (supported: gelu_pytorch_tanh)"
            )))
        }
    }
    let sliding_window = match v["sliding_window"].as_u64() {
        None | Some(0) => None,
        Some(size) => {
            let layers = match v["layer_types"].as_array() {
                Some(a) => a
                    .iter()
                    .map(|t| match t.as_str() {
                        Some("sliding_attention") => Ok(true),
                        Some("full_attention") => Ok(false),
                        _ => Err(Error::Unsupported(format!(
                            "layer type {t} (supported: sliding_attention, full_attention)"
                        ))),
                    })
                    .collect::<Result<Vec<bool>>>()?,
                None => pattern_layers(
                    n_layers,
                    v["sliding_window_pattern"]
                        .as_u64()
                        .unwrap_or(PATTERN as u64) as usize,
                ),
            };
            let local = &v["rope_parameters"]["sliding_attention"];
            let theta = v["rope_local_base_freq"]
                .as_f64()
                .or(local["rope_theta"].as_f64())
                .unwrap_or(LOCAL_THETA);
            Some(SlidingWindow {
                size: size as usize,
                layers,
                rope_theta: Some(theta as f32),
            })
        }
    };
    let scalar = v["query_pre_attn_scalar"].as_f64().unwrap_or(256.0);
    Ok(Extras {
        activation: Activation::GeluTanh,
        post_norms: true,
        embed_scale: Some((hidden as f32).sqrt()),
        attn_scale: Some((1.0 / scalar.sqrt()) as f32),
        sliding_window,
        final_softcap: v["final_logit_softcapping"].as_f64().map(|c| c as f32),
        norm_plus_one: true,
    })
}
