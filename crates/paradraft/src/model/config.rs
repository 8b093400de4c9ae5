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
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
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
        if self.hidden_size == 0 || self.n_layers == 0 || self.vocab_size == 0 {
            return bad("model has an empty dimension".into());
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(format!("rope theta {} is invalid", self.rope_theta));
        }
        Ok(())
    }

    /// RoPE inverse frequencies, one per pair, with scaling applied.
    pub fn inv_freqs(&self) -> Vec<f32> {
        let d = self.head_dim;
        let base: Vec<f64> = (0..d / 2)
            .map(|i| 1.0 / (self.rope_theta as f64).powf(2.0 * i as f64 / d as f64))
            .collect();
        let scaled: Vec<f64> = match &self.rope_scaling {
            RopeScaling::None => base,
            RopeScaling::Linear(f) => base.iter().map(|x| x / *f as f64).collect(),
            RopeScaling::Factors(fs) => base.iter().zip(fs).map(|(x, f)| x / *f as f64).collect(),
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
