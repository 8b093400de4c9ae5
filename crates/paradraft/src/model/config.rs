//! Architecture hyper-parameters, read from GGUF metadata or an HF `config.json`.

use crate::error::{Error, Result};
use crate::runtime::ops::RopeStyle;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, SmolLM2 and other Llama-shaped models.
    Llama,
    /// Qwen2 / Qwen2.5: q/k/v biases.
    Qwen2,
    /// Qwen3: per-head q/k RMSNorm, no biases.
    Qwen3,
    /// Gemma (1): GeGLU, scaled embeddings.
    Gemma,
    /// Gemma 2: Gemma's layer with norms after attention and MLP too, alternating
    /// sliding-window layers, attention and final logit soft-caps.
    Gemma2,
    /// Gemma 3: Gemma 2 with q/k norms, sliding-window layers with their own RoPE base, no
    /// attention soft-cap.
    Gemma3,
    /// Phi-3: fused q/k/v and gate/up projections (split at load).
    Phi3,
    /// Qwen3-MoE: Qwen3's attention, a mixture-of-experts MLP in every layer.
    Qwen3Moe,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma => "gemma",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
            Arch::Qwen3Moe => "qwen3moe",
        }
    }

    /// Whether its attention normalises q and k per head.
    pub fn qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen3Moe)
    }
}

/// Llama-3 style frequency-dependent RoPE scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: f32,
}

#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear(f32),
    Llama3(Llama3Scaling),
    /// Per-frequency divisors (GGUF `rope_freqs.weight`).
    Factors(Vec<f32>),
    /// Phi-3's LongRoPE ("su"): per-frequency divisors, `short` for a context of at most
    /// `original` tokens and `long` beyond (chosen by the context's size, as llama.cpp does),
    /// with cos and sin scaled by `attn_factor`.
    LongRope {
        short: Vec<f32>,
        long: Vec<f32>,
        original: usize,
        attn_factor: f32,
    },
}

/// The MLP's gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Activation {
    /// SwiGLU (Llama, Qwen).
    #[default]
    Silu,
    /// GeGLU with the tanh approximation of GELU (Gemma).
    GeluTanh,
}

/// Sliding-window attention: layers whose tokens see only the last `size` positions.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    pub size: usize,
    /// Per layer: whether it slides (the others attend globally).
    pub layers: Vec<bool>,
    /// RoPE base of the sliding layers (without scaling), when it differs from the global one.
    pub rope_theta: Option<f32>,
}

/// A mixture-of-experts MLP (Mixtral, Qwen3-MoE, Qwen2-MoE): a router picks `n_used` of
/// `n_experts` SwiGLU experts per token by the softmax of its logits, and their outputs are
/// summed weighted by those probabilities (renormalised over the chosen ones when `norm_topk`);
/// a shared expert, when there is one, runs on every token and is added too.
#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    pub n_experts: usize,
    pub n_used: usize,
    /// Each expert's hidden width.
    pub ff: usize,
    pub norm_topk: bool,
    pub shared: Option<SharedExpert>,
}

/// An expert every token uses beside the routed ones (Qwen2-MoE's), its output scaled by
/// sigmoid(g · x) of its own gate vector g.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SharedExpert {
    /// Its hidden width.
    pub ff: usize,
}

/// What a family's decoder does beyond the Llama layer (all off for Llama and Qwen).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Extras {
    pub activation: Activation,
    /// RMSNorms on the attention's and the MLP's outputs before each residual add (Gemma).
    pub post_norms: bool,
    /// Token embeddings are multiplied by this (Gemma: √hidden).
    pub embed_scale: Option<f32>,
    /// Attention scores are scaled by this instead of 1/√head_dim.
    pub attn_scale: Option<f32>,
    pub sliding_window: Option<SlidingWindow>,
    /// Logits become c·tanh(logit / c).
    pub final_softcap: Option<f32>,
    /// Attention scores (after scaling) become c·tanh(score / c) (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Stored RMSNorm weights are offsets from 1 (Gemma's HF checkpoints; its GGUF files
    /// store 1 + w).
    pub norm_plus_one: bool,
    /// Every layer's MLP is a mixture of experts.
    pub moe: Option<Moe>,
    /// RoPE rotates only the first this many dimensions of each head (partial rotary
    /// embeddings: Phi-4-mini's 96 of 128); `None`: all of them.
    pub rotary_dim: Option<usize>,
}

impl Extras {
    /// RMSNorm weights as the forward multiplies by them (1 + w where they are stored as
    /// offsets from 1).
    pub(crate) fn norm_weights(&self, mut w: Vec<f32>) -> Vec<f32> {
        if self.norm_plus_one {
            w.iter_mut().for_each(|x| *x += 1.0);
        }
        w
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub rope_style: RopeStyle,
    /// The model's trained context length.
    pub max_position_embeddings: usize,
    pub tie_embeddings: bool,
    pub extras: Extras,
}

impl Config {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Unsupported(m));
        if self.n_heads == 0
            || self.n_kv_heads == 0
            || !self.n_heads.is_multiple_of(self.n_kv_heads)
        {
            return bad(format!(
                "{} attention heads are not a multiple of {} KV heads",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!("head dimension {} must be even", self.head_dim));
        }
        if self.head_dim > crate::kv::MAX_HEAD_DIM {
            return bad(format!(
                "head dimension {} exceeds {}",
                self.head_dim,
                crate::kv::MAX_HEAD_DIM
            ));
        }
        if let Some(r) = self.extras.rotary_dim {
            if r == 0 || !r.is_multiple_of(2) || r > self.head_dim {
                return bad(format!(
                    "{r} rotated dimensions per head (partial rotary embeddings) must be even and within the head's {}",
                    self.head_dim
                ));
            }
        }
        if self.hidden_size == 0 || self.n_layers == 0 || self.vocab_size == 0 {
            return bad("model has an empty dimension".into());
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(format!("rope theta {} is invalid", self.rope_theta));
        }
        if let RopeScaling::LongRope {
            short,
            long,
            original,
            attn_factor,
        } = &self.rope_scaling
        {
            let half = self.rope_dims() / 2;
            let ok = |f: &Vec<f32>| f.len() == half && f.iter().all(|x| x.is_finite() && *x > 0.0);
            let usable = ok(short)
                && ok(long)
                && *original != 0
                && attn_factor.is_finite()
                && *attn_factor > 0.0;
            if !usable {
                return bad(format!(
                    "LongRoPE needs {half} positive short and long factors, an original context and a positive attention factor (got {} / {}, {original}, {attn_factor})",
                    short.len(),
                    long.len()
                ));
            }
        }
        if let Some(w) = &self.extras.sliding_window {
            if w.size == 0 || w.layers.len() != self.n_layers {
                return bad(format!(
                    "sliding window of {} over {} layer flags for {} layers",
                    w.size,
                    w.layers.len(),
                    self.n_layers
                ));
            }
            if let Some(t) = w.rope_theta.filter(|t| !(t.is_finite() && *t > 0.0)) {
                return bad(format!("sliding-window rope theta {t} is invalid"));
            }
        }
        if let Some(m) = &self.extras.moe {
            let shared_ff = m.shared.map_or(1, |s| s.ff);
            if m.n_experts == 0
                || m.n_used == 0
                || m.n_used > m.n_experts
                || m.ff == 0
                || shared_ff == 0
            {
                return bad(format!(
                    "mixture of experts: {} of {} experts per token, expert width {}, shared \
                     expert width {:?}",
                    m.n_used,
                    m.n_experts,
                    m.ff,
                    m.shared.map(|s| s.ff)
                ));
            }
        }
        let positive = |v: Option<f32>| v.is_none_or(|x| x.is_finite() && x > 0.0);
        let e = &self.extras;
        if !positive(e.embed_scale)
            || !positive(e.attn_scale)
            || !positive(e.final_softcap)
            || !positive(e.attn_softcap)
        {
            return bad(format!(
                "embedding scale {:?}, attention scale {:?} and soft-caps {:?} / {:?} must be positive",
                e.embed_scale, e.attn_scale, e.final_softcap, e.attn_softcap
            ));
        }
        Ok(())
    }

    /// RoPE inverse frequencies of the sliding-window layers, when their base differs (no
    /// scaling: Gemma 3 scales only its global layers).
    pub fn inv_freqs_local(&self) -> Option<Vec<f32>> {
        let theta = self.extras.sliding_window.as_ref()?.rope_theta?;
        Some(
            base_freqs(theta, self.rope_dims())
                .into_iter()
                .map(|x| x as f32)
                .collect(),
        )
    }

    /// LongRoPE's frequencies for contexts beyond its original length: (that length, the long
    /// factors' inverse frequencies).
    pub fn inv_freqs_long(&self) -> Option<(usize, Vec<f32>)> {
        let RopeScaling::LongRope { long, original, .. } = &self.rope_scaling else {
            return None;
        };
        let base = base_freqs(self.rope_theta, self.rope_dims());
        let f = base.iter().zip(long).map(|(x, f)| (x / *f as f64) as f32);
        Some((*original, f.collect()))
    }

    /// The dimensions of each head RoPE rotates (the first ones; the rest pass unrotated).
    pub fn rope_dims(&self) -> usize {
        self.extras.rotary_dim.unwrap_or(self.head_dim)
    }

    /// What cos and sin are multiplied by (LongRoPE's attention factor; else 1).
    pub fn rope_attn_factor(&self) -> f32 {
        match &self.rope_scaling {
            RopeScaling::LongRope { attn_factor, .. } => *attn_factor,
            _ => 1.0,
        }
    }

    /// RoPE inverse frequencies, one per pair, with scaling applied.
    pub fn inv_freqs(&self) -> Vec<f32> {
        let d = self.rope_dims();
        let base = base_freqs(self.rope_theta, d);
        let scaled: Vec<f64> = match &self.rope_scaling {
            RopeScaling::None => base,
            RopeScaling::Linear(f) => base.iter().map(|x| x / *f as f64).collect(),
            RopeScaling::Factors(fs) | RopeScaling::LongRope { short: fs, .. } => {
                base.iter().zip(fs).map(|(x, f)| x / *f as f64).collect()
            }
            RopeScaling::Llama3(s) => {
                let (factor, lo, hi, orig) = (
                    s.factor as f64,
                    s.low_freq_factor as f64,
                    s.high_freq_factor as f64,
                    s.original_max_position_embeddings as f64,
                );
                let low_wavelen = orig / lo;
                let high_wavelen = orig / hi;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (orig / wavelen - lo) / (hi - lo);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
        };
        scaled.into_iter().map(|x| x as f32).collect()
    }
}

fn base_freqs(theta: f32, d: usize) -> Vec<f64> {
    (0..d / 2)
        .map(|i| 1.0 / (theta as f64).powf(2.0 * i as f64 / d as f64))
        .collect()
}
