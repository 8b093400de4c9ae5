//! Models: configuration, weight sources (GGUF, safetensors), the Llama-family forward, the
//! tokenizer and chat template, and one entry point that loads a model from a path.

pub mod config;
pub mod forward;
mod gemma;
pub mod gguf;
pub mod layer;
pub mod llama;
mod moe;
pub mod options;
mod phi3;
pub mod pyjson;
pub mod source;
mod spm;
mod token_bytes;
pub mod tokenizer;

pub use config::{Arch, Config};
pub use forward::{Batch, Logits, Output, OutputSpec, Rows, TreeMask};
pub use llama::{Model, Scratch};
pub use options::ModelOptions;
pub use tokenizer::{ChatEnd, Message, StreamDecoder, Tokenizer};

use crate::error::{Error, Result};
use crate::runtime::ops::RopeStyle;
use config::{Extras, Llama3Scaling, RopeScaling, SlidingWindow};
use gguf::GgufFile;
use source::{SafetensorsSource, TensorSource};
use std::path::{Path, PathBuf};

/// A model with its tokenizer.
pub struct Loaded {
    pub model: Model,
    pub tokenizer: Tokenizer,
}

/// Loads a `.gguf` file or an HF model directory.
pub fn load(path: &Path) -> Result<Loaded> {
    load_truncated(path, None)
}

/// What runs on the tokenizer as soon as it is built, beside the weights' loading (a
/// drafter's n-gram tables, checked against the tokenizer, open there).
pub type OnTokenizer<'a> = &'a (dyn Fn(&Tokenizer) + Sync);

/// [`load`], calling `on_tokenizer` on the tokenizer while the weights load.
pub fn load_with(path: &Path, on_tokenizer: OnTokenizer<'_>) -> Result<Loaded> {
    crate::runtime::isa::selected().map_err(crate::Error::BadRequest)?;
    load_full(path, on_tokenizer)
}

/// Loads a model keeping only its first `layers` decoder layers (then the final norm and the
/// output layer): a self-speculative drafter made from the target itself.
pub fn load_truncated(path: &Path, layers: Option<usize>) -> Result<Loaded> {
    // A kernel family the CPU lacks is refused here, before any forward could use it.
    crate::runtime::isa::selected().map_err(crate::Error::BadRequest)?;
    let mut lm = load_full(path, &|_| {})?;
    if let Some(n) = layers {
        lm.model = lm.model.truncate_layers(n)?;
    }
    Ok(lm)
}

fn load_full(path: &Path, on_tokenizer: OnTokenizer<'_>) -> Result<Loaded> {
    if !path.exists() {
        return Err(Error::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
        ));
    }
    if path.is_dir() {
        load_hf_dir(path, on_tokenizer)
    } else {
        load_gguf(path, on_tokenizer)
    }
}

fn load_gguf(path: &Path, on_tokenizer: OnTokenizer<'_>) -> Result<Loaded> {
    let g = GgufFile::open(path)?;
    let arch_name = g.str("general.architecture").unwrap_or("").to_string();
    let arch = match arch_name.as_str() {
        "llama" => Arch::Llama,
        "qwen2" => Arch::Qwen2,
        "qwen3" => Arch::Qwen3,
        "gemma" => Arch::Gemma,
        "gemma2" => Arch::Gemma2,
        "gemma3" => Arch::Gemma3,
        "phi3" => Arch::Phi3,
        "qwen3moe" => Arch::Qwen3Moe,
        // Qwen2's attention; its mixture of experts comes with the file's expert keys.
        "qwen2moe" => Arch::Qwen2,
        other => {
            return Err(Error::Unsupported(format!(
                "architecture {other:?} (supported: llama (and Mixtral), qwen2, qwen2moe, qwen3, qwen3moe, gemma, gemma2, gemma3, phi3, dream)"
            )))
        }
    };
    let key = |k: &str| format!("{arch_name}.{k}");
    let moe = moe::gguf_moe(&g, &arch_name)?;
    if moe.is_none() && arch_name.ends_with("moe") {
        return Err(Error::Unsupported(format!(
            "a {arch_name} file without {arch_name}.expert_count"
        )));
    }
    let hidden = g.req_u64(&key("embedding_length"))? as usize;
    let n_heads = g.req_u64(&key("attention.head_count"))? as usize;
    let head_dim = g
        .u64(&key("attention.key_length"))
        .map(|v| v as usize)
        .unwrap_or(hidden / n_heads.max(1));
    let embd = g
        .shape("token_embd.weight")
        .ok_or_else(|| g.missing("token_embd.weight"))?;
    let rotary_dim = match arch {
        Arch::Phi3 => phi3::gguf_rotary(&g, head_dim),
        _ => None,
    };
    let rope_dims = rotary_dim.unwrap_or(head_dim);
    let rope_scaling = if let Some(ls) = phi3::gguf_longrope(&g, &arch_name, rope_dims)? {
        ls
    } else if let Some(t) = g.tensors.get("rope_freqs.weight") {
        let mut v = vec![0f32; t.dims[0]];
        crate::runtime::quant::dequantize(t.dtype, g.data(t), &mut v);
        RopeScaling::Factors(v)
    } else {
        match g.str(&key("rope.scaling.type")) {
            None | Some("none") => RopeScaling::None,
            Some("linear") => {
                RopeScaling::Linear(g.f64(&key("rope.scaling.factor")).unwrap_or(1.0) as f32)
            }
            Some(other) => return Err(Error::Unsupported(format!("rope scaling {other:?}"))),
        }
    };
    let n_layers = g.req_u64(&key("block_count"))? as usize;
    let extras = match arch {
        Arch::Gemma | Arch::Gemma2 | Arch::Gemma3 => {
            gemma::gguf_extras(&g, arch, (n_layers, hidden, n_heads, head_dim))?
        }
        _ => Extras::default(),
    };
    let intermediate_size = match &moe {
        Some(m) => m.ff,
        None => g.req_u64(&key("feed_forward_length"))? as usize,
    };
    let extras = Extras {
        moe,
        rotary_dim,
        ..extras
    };
    let config = Config {
        arch,
        vocab_size: embd[0],
        hidden_size: hidden,
        intermediate_size,
        n_layers,
        n_heads,
        n_kv_heads: g
            .u64(&key("attention.head_count_kv"))
            .unwrap_or(n_heads as u64) as usize,
        head_dim,
        rms_eps: g
            .f64(&key("attention.layer_norm_rms_epsilon"))
            .unwrap_or(1e-5) as f32,
        rope_theta: g.f64(&key("rope.freq_base")).unwrap_or(10000.0) as f32,
        rope_scaling,
        // GGUF Llama files carry q/k rows permuted for GGML's interleaved rope.
        rope_style: if arch == Arch::Llama {
            RopeStyle::Interleaved
        } else {
            RopeStyle::Half
        },
        max_position_embeddings: g.u64(&key("context_length")).unwrap_or(4096) as usize,
        tie_embeddings: !g.has("output.weight"),
        extras,
    };
    beside(
        || Tokenizer::from_gguf(&g),
        on_tokenizer,
        || Model::from_source(config, &g),
    )
}

fn load_hf_dir(dir: &Path, on_tokenizer: OnTokenizer<'_>) -> Result<Loaded> {
    let cp = dir.join("config.json");
    let text = std::fs::read_to_string(&cp).map_err(|e| Error::io(&cp, e))?;
    let bad = |reason: String| Error::BadModelFile {
        path: cp.clone(),
        format: "config.json",
        reason,
    };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let config = hf_config(&v, &cp)?;
    let src = SafetensorsSource::open(dir)?;
    let config = Config {
        tie_embeddings: config.tie_embeddings || !src.has("output.weight"),
        ..config
    };
    beside(
        || Tokenizer::from_hf_dir(dir, &v),
        on_tokenizer,
        || Model::from_source(config, &src),
    )
}

/// The tokenizer (then `on_tokenizer` on it) on a thread of its own while `weights` load on
/// this one: building SmolLM2's BPE from GGUF metadata took ~40 ms of a ~200 ms cold
/// `generate` before the weights began (2-vCPU Intel Xeon), and the weights' conversion
/// leaves the second core idle in its serial parts. The tokenizer's error is reported first,
/// as when it was built first; a thread that cannot be made builds it here, after the weights.
fn beside(
    tokenizer: impl Fn() -> Result<Tokenizer> + Sync,
    on_tokenizer: OnTokenizer<'_>,
    weights: impl FnOnce() -> Result<Model>,
) -> Result<Loaded> {
    let side = || {
        let t = tokenizer()?;
        on_tokenizer(&t);
        Ok(t)
    };
    // A reference, so that `side` can still run here when no thread can be made.
    let again = &side;
    let (tokenizer, model) = std::thread::scope(|s| {
        let h = std::thread::Builder::new()
            .name("paradraft-tokenizer".into())
            .spawn_scoped(s, again);
        let model = weights();
        let tokenizer = match h {
            Ok(h) => h.join().unwrap_or_else(|_| {
                Err(Error::Unsupported("the tokenizer's thread panicked".into()))
            }),
            Err(_) => side(),
        };
        (tokenizer, model)
    });
    Ok(Loaded {
        tokenizer: tokenizer?,
        model: model?,
    })
}

/// `dir/config.json` parsed as JSON (its path comes back for later errors); `format` names the
/// file in errors.
pub fn read_config_json(dir: &Path, format: &'static str) -> Result<(serde_json::Value, PathBuf)> {
    let p = dir.join("config.json");
    let text = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
    let v = serde_json::from_str(&text).map_err(|e| Error::BadModelFile {
        path: p.clone(),
        format,
        reason: e.to_string(),
    })?;
    Ok((v, p))
}

/// A model configuration from an HF `config.json` (Llama, Qwen2 and Qwen3 keys; DFlash
/// drafters use the Qwen3 ones). `path` is named in errors.
pub fn hf_config(v: &serde_json::Value, path: &Path) -> Result<Config> {
    let bad = |reason: String| Error::BadModelFile {
        path: path.to_path_buf(),
        format: "config.json",
        reason,
    };
    let model_type = v["model_type"].as_str().unwrap_or("").to_ascii_lowercase();
    let arch = match model_type.as_str() {
        "llama" | "mistral" => Arch::Llama,
        // Dream (a diffusion LM adapted from Qwen2.5) keeps Qwen2's layers.
        "qwen2" | "dream" => Arch::Qwen2,
        "qwen3" => Arch::Qwen3,
        "qwen3_moe" => Arch::Qwen3Moe,
        "qwen2_moe" => Arch::Qwen2,
        "mixtral" => Arch::Llama,
        "gemma" => Arch::Gemma,
        "gemma2" => Arch::Gemma2,
        "gemma3_text" => Arch::Gemma3,
        "phi3" => Arch::Phi3,
        "gemma3" => return Err(Error::Unsupported(
            "model_type \"gemma3\" (the image-text checkpoint): paradraft runs its text model, \
                 a gemma3_text directory or a GGUF"
                .into(),
        )),
        other => {
            return Err(Error::Unsupported(format!(
                "model_type {other:?} (supported: llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma, gemma2, gemma3_text, phi3, dream)"
            )))
        }
    };
    let req = |k: &str| -> Result<usize> {
        v[k].as_u64()
            .map(|x| x as usize)
            .ok_or_else(|| bad(format!("missing integer {k}")))
    };
    let hidden = req("hidden_size")?;
    let n_heads = req("num_attention_heads")?;
    if v["mlp_bias"].as_bool() == Some(true) {
        return Err(Error::Unsupported("MLP biases (mlp_bias: true)".into()));
    }
    let qwen_window = ["qwen2", "qwen2_moe", "qwen3", "qwen3_moe"].contains(&model_type.as_str());
    if v["use_sliding_window"].as_bool() == Some(true) && !qwen_window {
        return Err(Error::Unsupported(format!(
            "use_sliding_window in a {model_type} config"
        )));
    }
    // transformers 5 writes `rope_parameters` (theta inside; per layer type for Gemma 3);
    // older files `rope_theta` + `rope_scaling`.
    let rp = match &v["rope_parameters"]["full_attention"] {
        full if full.is_object() => full,
        _ => &v["rope_parameters"],
    };
    // An explicit `rope_scaling` wins over `rope_parameters` (a file with both is an older
    // config edited by hand; ignoring the scaling it names would run another model).
    let rs = if v["rope_scaling"].is_object() || !rp.is_object() {
        &v["rope_scaling"]
    } else {
        rp
    };
    let rope_theta = v["rope_theta"]
        .as_f64()
        .or(rp["rope_theta"].as_f64())
        .unwrap_or(10000.0);
    let rope_scaling = if rs.is_null() {
        RopeScaling::None
    } else {
        let ty = rs["rope_type"]
            .as_str()
            .or(rs["type"].as_str())
            .unwrap_or("default");
        let f = |k: &str, d: f64| rs[k].as_f64().unwrap_or(d) as f32;
        match ty {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear(f("factor", 1.0)),
            "longrope" | "su" => phi3::hf_longrope(v, rs)?,
            "llama3" => RopeScaling::Llama3(Llama3Scaling {
                factor: f("factor", 8.0),
                low_freq_factor: f("low_freq_factor", 1.0),
                high_freq_factor: f("high_freq_factor", 4.0),
                original_max_position_embeddings: f("original_max_position_embeddings", 8192.0),
            }),
            other => return Err(Error::Unsupported(format!("rope scaling {other:?}"))),
        }
    };
    let n_layers = req("num_hidden_layers")?;
    let extras = match arch {
        Arch::Gemma | Arch::Gemma2 | Arch::Gemma3 => gemma::hf_extras(v, arch, n_layers, hidden)?,
        // Mistral v0.1 and Phi-3 slide a window over every layer in transformers (llama.cpp
        // does not for Phi-3; its GGUF files carry none).
        _ if ["mistral", "mixtral", "phi3"].contains(&model_type.as_str()) => Extras {
            sliding_window: v["sliding_window"].as_u64().map(|size| SlidingWindow {
                size: size as usize,
                layers: vec![true; n_layers],
                rope_theta: None,
            }),
            ..Extras::default()
        },
        // Qwen2 / Qwen3 with `use_sliding_window`: a window on the layers `layer_types` marks
        // sliding, else on those from `max_window_layers` on (transformers' rule).
        _ if qwen_window && v["use_sliding_window"].as_bool() == Some(true) => {
            let size = v["sliding_window"]
                .as_u64()
                .ok_or_else(|| bad("use_sliding_window without a sliding_window size".into()))?;
            let layers: Vec<bool> = match v["layer_types"].as_array() {
                Some(t) => t
                    .iter()
                    .map(|x| x.as_str() == Some("sliding_attention"))
                    .collect(),
                None => {
                    let from = v["max_window_layers"].as_u64().unwrap_or(28) as usize;
                    (0..n_layers).map(|i| i >= from).collect()
                }
            };
            Extras {
                sliding_window: layers.contains(&true).then_some(SlidingWindow {
                    size: size as usize,
                    layers,
                    rope_theta: None,
                }),
                ..Extras::default()
            }
        }
        _ => Extras::default(),
    };
    let moe = moe::hf_moe(v, &model_type)?;
    let intermediate_size = match &moe {
        Some(m) => m.ff,
        None => req("intermediate_size")?,
    };
    let head_dim = v["head_dim"]
        .as_u64()
        .map(|x| x as usize)
        .unwrap_or(hidden / n_heads.max(1));
    let rotary_dim = match arch {
        Arch::Phi3 => phi3::hf_rotary(v, head_dim),
        _ => None,
    };
    let extras = Extras {
        moe,
        rotary_dim,
        ..extras
    };
    Ok(Config {
        arch,
        vocab_size: req("vocab_size")?,
        hidden_size: hidden,
        intermediate_size,
        n_layers,
        n_heads,
        n_kv_heads: v["num_key_value_heads"]
            .as_u64()
            .map(|x| x as usize)
            .unwrap_or(n_heads),
        head_dim,
        rms_eps: v["rms_norm_eps"].as_f64().unwrap_or(1e-6) as f32,
        rope_theta: rope_theta as f32,
        rope_scaling,
        rope_style: RopeStyle::Half,
        max_position_embeddings: v["max_position_embeddings"].as_u64().unwrap_or(4096) as usize,
        tie_embeddings: v["tie_word_embeddings"].as_bool().unwrap_or(false),
        extras,
    })
}
