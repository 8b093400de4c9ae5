//! Gemma 1, 2 and 3 (text): what their GGUF metadata and HF `config.json` say beyond the
//! Llama keys. The layers are the shared decoder layer with Gemma's pieces switched on
//! ([`Extras`]): GeGLU (tanh GELU) and embeddings scaled by √hidden (all three); RMSNorms after
//! attention and after the MLP, sliding-window layers, a final logit soft-cap (Gemma 2 and 3);
//! an attention soft-cap and every other layer sliding (Gemma 2); q/k RMSNorm and sliding
//! layers (five of six) with their own RoPE base, 10,000, RoPE scaling on the global layers only
//! (Gemma 3). Gemma's HF checkpoints store RMSNorm weights as offsets from 1; its GGUF files
//! store 1 + w.

use super::config::{Activation, Arch, Extras, SlidingWindow};
use super::gguf::{GgufFile, Value};
use crate::error::{Error, Result};

/// llama.cpp's defaults for files that leave them out: Gemma 3's sliding pattern and local
/// RoPE base; Gemma 2's pattern, window and soft-caps.
const PATTERN: usize = 6;
const LOCAL_THETA: f64 = 10_000.0;
const PATTERN_2: usize = 2;
const WINDOW_2: u64 = 4096;
const ATTN_CAP_2: f64 = 50.0;
const FINAL_CAP_2: f64 = 30.0;

/// The attention scale: 1/√head_dim, except the 27B models' 1/√(hidden / heads), which
/// llama.cpp recognises by their layer count (HF configs carry `query_pre_attn_scalar`).
fn gguf_attn_scale(
    arch: Arch,
    n_layers: usize,
    hidden: usize,
    n_heads: usize,
    head_dim: usize,
) -> f32 {
    let big = matches!((arch, n_layers), (Arch::Gemma3, 62) | (Arch::Gemma2, 46));
    let d = if big {
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
    arch: Arch,
    (n_layers, hidden, n_heads, head_dim): (usize, usize, usize, usize),
) -> Result<Extras> {
    let key = |k: &str| format!("{}.{k}", arch.name());
    let gemma = Extras {
        activation: Activation::GeluTanh,
        embed_scale: Some((hidden as f32).sqrt()),
        ..Extras::default()
    };
    if arch == Arch::Gemma {
        return Ok(gemma);
    }
    let gemma2 = arch == Arch::Gemma2;
    let window = g
        .u64(&key("attention.sliding_window"))
        .unwrap_or(if gemma2 { WINDOW_2 } else { 0 });
    let sliding_window = match window {
        0 => None,
        size => {
            let n = if gemma2 { PATTERN_2 } else { PATTERN };
            let layers = match g.get(&key("attention.sliding_window_pattern")) {
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_bool().or(v.as_u64().map(|x| x != 0)))
                    .collect::<Option<Vec<bool>>>()
                    .ok_or_else(|| {
                        Error::Unsupported(format!(
                            "{} sliding_window_pattern holds non-flags",
                            arch.name()
                        ))
                    })?,
                Some(v) => pattern_layers(n_layers, v.as_u64().unwrap_or(n as u64) as usize),
                None => pattern_layers(n_layers, n),
            };
            // Gemma 2's sliding layers share the global RoPE base unless the file says
            // otherwise; Gemma 3's default to 10,000.
            let local = g
                .f64(&key("rope.freq_base_swa"))
                .or((!gemma2).then_some(LOCAL_THETA));
            Some(SlidingWindow {
                size: size as usize,
                layers,
                rope_theta: local.map(|t| t as f32),
            })
        }
    };
    let cap = |k: &str, default: f64| {
        g.f64(&key(k))
            .or(gemma2.then_some(default))
            .filter(|&c| c != 0.0)
            .map(|c| c as f32)
    };
    Ok(Extras {
        post_norms: true,
        attn_scale: Some(gguf_attn_scale(arch, n_layers, hidden, n_heads, head_dim)),
        sliding_window,
        final_softcap: cap("final_logit_softcapping", FINAL_CAP_2),
        attn_softcap: if gemma2 {
            cap("attn_logit_softcapping", ATTN_CAP_2)
        } else {
            None
        },
        ..gemma
    })
}

/// The extras of an HF `gemma`, `gemma2` or `gemma3_text` config (`v`) with `n_layers` layers
/// and `hidden` width.
pub(crate) fn hf_extras(
    v: &serde_json::Value,
    arch: Arch,
    n_layers: usize,
    hidden: usize,
) -> Result<Extras> {
    let attn_softcap = v["attn_logit_softcapping"].as_f64().map(|c| c as f32);
    if arch == Arch::Gemma3 && attn_softcap.is_some() {
        return Err(Error::Unsupported(
            "attention logit soft-capping in a Gemma 3 config (Gemma 2 has it; Gemma 3 none)"
                .into(),
        ));
    }
    match v["hidden_activation"]
        .as_str()
        .or(v["hidden_act"].as_str())
        .unwrap_or("gelu_pytorch_tanh")
    {
        // Gemma 1 configs say "gelu" where the model (and llama.cpp) use the tanh form.
        "gelu_pytorch_tanh" | "gelu_tanh" | "gelu" => {}
        other => {
            return Err(Error::Unsupported(format!(
                "Gemma activation {other:?} (supported: gelu_pytorch_tanh)"
            )))
        }
    }
    let gemma = Extras {
        activation: Activation::GeluTanh,
        embed_scale: Some((hidden as f32).sqrt()),
        norm_plus_one: true,
        ..Extras::default()
    };
    if arch == Arch::Gemma {
        return Ok(gemma);
    }
    let gemma2 = arch == Arch::Gemma2;
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
                None => {
                    let n = if gemma2 { PATTERN_2 } else { PATTERN };
                    let n = v["sliding_window_pattern"].as_u64().unwrap_or(n as u64);
                    pattern_layers(n_layers, n as usize)
                }
            };
            let local = &v["rope_parameters"]["sliding_attention"];
            let theta = v["rope_local_base_freq"]
                .as_f64()
                .or(local["rope_theta"].as_f64())
                .or((!gemma2).then_some(LOCAL_THETA));
            Some(SlidingWindow {
                size: size as usize,
                layers,
                rope_theta: theta.map(|t| t as f32),
            })
        }
    };
    let scalar = v["query_pre_attn_scalar"].as_f64().unwrap_or(256.0);
    Ok(Extras {
        post_norms: true,
        attn_scale: Some((1.0 / scalar.sqrt()) as f32),
        sliding_window,
        final_softcap: v["final_logit_softcapping"].as_f64().map(|c| c as f32),
        attn_softcap,
        ..gemma
    })
}
