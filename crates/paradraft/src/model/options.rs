//! How a model is set up to run: which file, worker threads, KV element type and context —
//! checked against the model and this machine's memory (also the command line's model flags).

use super::Loaded;
use crate::error::{Error, Result};
use std::path::PathBuf;

/// The most worker threads a run may ask for.
const MAX_THREADS: usize = 1024;

#[derive(Clone, Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct ModelOptions {
    /// A .gguf file or an HF model directory; defaults to the fetched SmolLM2.
    #[cfg_attr(feature = "cli", arg(long))]
    pub model: Option<PathBuf>,
    /// Worker threads (default: all available cores).
    #[cfg_attr(feature = "cli", arg(long))]
    pub threads: Option<usize>,
    /// KV-cache capacity in tokens (default: the model's context length, at most 8192). Above
    /// the model's trained context only with --force-ctx-size; never beyond available memory.
    #[cfg_attr(feature = "cli", arg(long))]
    pub ctx_size: Option<usize>,
    /// Allow --ctx-size above the model's trained context length.
    #[cfg_attr(feature = "cli", arg(long))]
    pub force_ctx_size: bool,
    /// KV-cache element type: f16 (half the attention traffic of f32), f32, or q8_0 (about half
    /// of f16's bytes: int8 in blocks of 32 values with an f16 scale, as llama.cpp's
    /// `-ctk q8_0 -ctv q8_0`; docs/performance.md gives its accuracy and speed).
    #[cfg_attr(feature = "cli", arg(long, default_value = "f16"))]
    pub kv_dtype: crate::kv::KvDtype,
    /// Quantize the model's dense (f32 / f16 / bf16) weights at load — an HF checkpoint or an
    /// F16 GGUF — to run on the int8 kernels: q8_0 (near lossless), q4_0, q4_1 (llama.cpp's
    /// reference quantisers), q2_k / q3_k / q4_k / q5_k (as llama-quantize's Q2_K / Q3_K_M /
    /// Q4_K_M / Q5_K_M mixes: Q6_K embedding and output), q6_k, or iq4_nl / iq4_xs (llama-quantize's
    /// IQ4_NL / IQ4_XS mixes, no importance matrix); docs/gguf.md gives their accuracy. Quantized
    /// weights stay as they are.
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub quantize: Option<WeightQuant>,
}

/// A type `--quantize` converts dense weights to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum WeightQuant {
    #[cfg_attr(feature = "cli", value(name = "q8_0"))]
    Q8_0,
    #[cfg_attr(feature = "cli", value(name = "q4_0"))]
    Q4_0,
    #[cfg_attr(feature = "cli", value(name = "q4_1"))]
    Q4_1,
    #[cfg_attr(feature = "cli", value(name = "q2_k"))]
    Q2K,
    #[cfg_attr(feature = "cli", value(name = "q3_k"))]
    Q3K,
    #[cfg_attr(feature = "cli", value(name = "q4_k"))]
    Q4K,
    #[cfg_attr(feature = "cli", value(name = "q5_k"))]
    Q5K,
    #[cfg_attr(feature = "cli", value(name = "q6_k"))]
    Q6K,
    #[cfg_attr(feature = "cli", value(name = "iq4_nl"))]
    Iq4Nl,
    #[cfg_attr(feature = "cli", value(name = "iq4_xs"))]
    Iq4Xs,
}

impl WeightQuant {
    pub fn ggml(self) -> crate::runtime::quant::GgmlType {
        use crate::runtime::quant::GgmlType;
        match self {
            WeightQuant::Q8_0 => GgmlType::Q8_0,
            WeightQuant::Q4_0 => GgmlType::Q4_0,
            WeightQuant::Q4_1 => GgmlType::Q4_1,
            WeightQuant::Q2K => GgmlType::Q2_K,
            WeightQuant::Q3K => GgmlType::Q3_K,
            WeightQuant::Q4K => GgmlType::Q4_K,
            WeightQuant::Q5K => GgmlType::Q5_K,
            WeightQuant::Q6K => GgmlType::Q6_K,
            WeightQuant::Iq4Nl => GgmlType::IQ4_NL,
            WeightQuant::Iq4Xs => GgmlType::IQ4_XS,
        }
    }
}

/// Bytes the machine can still give (`MemAvailable`), when known.
fn available_memory() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

impl ModelOptions {
    /// The model's path (the default model's when none was given).
    pub fn path(&self) -> PathBuf {
        self.model
            .clone()
            .unwrap_or_else(crate::fetch::default_model_path)
    }

    /// Starts the worker threads, loads the model (fetching the default one when none was
    /// given) and returns it with its context: the asked one, checked against the trained
    /// context and the memory its KV cache needs.
    pub fn load(&self) -> Result<(Loaded, usize)> {
        self.load_with(&|_| {})
    }

    /// [`ModelOptions::load`], calling `on_tokenizer` on the tokenizer while the weights load.
    pub fn load_with(&self, on_tokenizer: super::OnTokenizer<'_>) -> Result<(Loaded, usize)> {
        let bad = |m: String| Err(Error::BadRequest(m));
        let cores = crate::runtime::default_threads();
        let threads = self.threads.unwrap_or(cores);
        if threads == 0 || threads > MAX_THREADS {
            return bad(format!(
                "--threads {threads}: must be between 1 and {MAX_THREADS}"
            ));
        }
        if threads > cores {
            eprintln!("warning: --threads {threads} is more than the {cores} cores available (slower, not faster)");
        }
        crate::runtime::init_threads(threads);
        let path = match &self.model {
            Some(p) => p.clone(),
            None => crate::fetch::ensure_default_model()?,
        };
        let mut loaded = super::load_with(&path, on_tokenizer)
            .map_err(|e| e.context(format!("loading {}", path.display())))?;
        loaded.model.set_kv_dtype(self.kv_dtype);
        if let Some(q) = self.quantize {
            loaded.model.quantize_dense(q.ggml());
        }
        let c = &loaded.model.config;
        let ctx = self.ctx_size.unwrap_or(c.max_position_embeddings.min(8192));
        if ctx == 0 {
            return bad("--ctx-size must be at least 1".into());
        }
        if ctx > c.max_position_embeddings && !self.force_ctx_size {
            return bad(format!(
                "--ctx-size {ctx} exceeds the model's trained context of {} tokens (pass --force-ctx-size to allow it)",
                c.max_position_embeddings
            ));
        }
        // K and V of every layer for every position (drafters and speculation add little).
        let slot = crate::kv::bytes_per_slot(c.n_layers, c.n_kv_heads, c.head_dim, self.kv_dtype);
        let kv_bytes = slot as u128 * ctx as u128;
        if let Some(avail) = available_memory() {
            if kv_bytes > avail as u128 {
                return bad(format!(
                    "--ctx-size {ctx} needs a {:.1} GiB KV cache but only {:.1} GiB of memory is available",
                    kv_bytes as f64 / (1u64 << 30) as f64,
                    avail as f64 / (1u64 << 30) as f64
                ));
            }
        }
        Ok((loaded, ctx))
    }
}
