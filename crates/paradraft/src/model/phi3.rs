//! Phi-3 (mini / medium, 4K context): the Llama layer with fused projections — one q/k/v matrix
//! (`attn_qkv`, HF `qkv_proj`) and one gate/up matrix (`ffn_up` of twice the MLP width, HF
//! `gate_up_proj`, the gate's rows first). [`Fused`] serves the separate matrices as row ranges
//! of the fused ones, exactly (a quantized row is self-contained), so the layer code is the
//! Llama one. LongRoPE (the 128K variants, Phi-3.5, Phi-4-mini) and partial rotary embeddings
//! are refused by name.

use super::config::Config;
use super::gguf::GgufFile;
use super::source::TensorSource;
use crate::error::{Error, Result};
use crate::runtime::quant::GgmlType;

/// A tensor source whose `attn_q` / `attn_k` / `attn_v` / `ffn_gate` / `ffn_up` matrices are
/// row ranges of the fused ones when the file has no separate ones.
pub(crate) struct Fused<'a> {
    inner: &'a dyn TensorSource,
    /// Rows of q, of k (= v), and the MLP width.
    qd: usize,
    kvd: usize,
    ff: usize,
}

impl<'a> Fused<'a> {
    pub(crate) fn new(inner: &'a dyn TensorSource, c: &Config) -> Self {
        Fused {
            inner,
            qd: c.n_heads * c.head_dim,
            kvd: c.n_kv_heads * c.head_dim,
            ff: c.intermediate_size,
        }
    }

    /// The fused tensor and row range a separate matrix is, if it is one.
    fn part(&self, name: &str) -> Option<(String, usize, usize)> {
        let (layer, tail) = name.strip_prefix("blk.")?.split_once('.')?;
        let (qd, kvd, ff) = (self.qd, self.kvd, self.ff);
        let (fused, start, rows) = match tail {
            "attn_q.weight" => ("attn_qkv", 0, qd),
            "attn_k.weight" => ("attn_qkv", qd, kvd),
            "attn_v.weight" => ("attn_qkv", qd + kvd, kvd),
            "ffn_gate.weight" => ("ffn_gate_up", 0, ff),
            "ffn_up.weight" => ("ffn_gate_up", ff, ff),
            _ => return None,
        };
        // GGUF files keep the fused gate/up under `ffn_up` (twice as tall); HF under
        // `gate_up_proj` (the source maps `ffn_gate_up` to it).
        let candidates = if fused == "ffn_gate_up" {
            vec!["ffn_gate_up", "ffn_up"]
        } else {
            vec![fused]
        };
        let total = if fused == "attn_qkv" {
            qd + 2 * kvd
        } else {
            2 * ff
        };
        candidates
            .into_iter()
            .map(|f| format!("blk.{layer}.{f}.weight"))
            .find(|f| {
                self.inner
                    .shape(f)
                    .is_some_and(|s| s.first() == Some(&total))
            })
            .map(|f| (f, start, rows))
    }
}

impl TensorSource for Fused<'_> {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        match self.part(name) {
            Some((f, _, rows)) => {
                let mut s = self.inner.shape(&f)?;
                s[0] = rows;
                Some(s)
            }
            None => self.inner.shape(name),
        }
    }

    fn raw(&self, name: &str) -> Option<(GgmlType, &[u8])> {
        match self.part(name) {
            Some((f, start, rows)) => {
                let cols = *self.inner.shape(&f)?.get(1)?;
                let (ty, bytes) = self.inner.raw(&f)?;
                let rb = ty.row_bytes(cols);
                bytes.get(start * rb..(start + rows) * rb).map(|b| (ty, b))
            }
            None => self.inner.raw(name),
        }
    }

    fn missing(&self, name: &str) -> Error {
        self.inner.missing(name)
    }
}

/// Refuses what this engine does not run of a Phi-3 GGUF: LongRoPE factors, partial rotary
/// embeddings.
pub(crate) fn check_gguf(g: &GgufFile, head_dim: usize) -> Result<()> {
    if g.has("rope_factors_long.weight") || g.has("rope_factors_short.weight") {
        return Err(Error::Unsupported(
            "Phi-3 LongRoPE (rope_factors_long / rope_factors_short: the 128K variants, \
             Phi-3.5, Phi-4-mini); the 4K-context Phi-3 models run"
                .into(),
        ));
    }
    if let Some(n) = g.u64("phi3.rope.dimension_count") {
        if n as usize != head_dim {
            return Err(Error::Unsupported(format!(
                "partial rotary embeddings ({n} of {head_dim} dimensions per head)"
            )));
        }
    }
    Ok(())
}

/// The same for an HF `phi3` config.
pub(crate) fn check_hf(v: &serde_json::Value) -> Result<()> {
    let rs = &v["rope_scaling"];
    let rp = &v["rope_parameters"]["rope_type"];
    if !rs.is_null() || rp.as_str().is_some_and(|t| t != "default") {
        return Err(Error::Unsupported(format!(
            "Phi-3 rope scaling {} (LongRoPE: the 128K variants, Phi-3.5, Phi-4-mini)",
            rs["type"]
                .as_str()
                .or(rs["rope_type"].as_str())
                .unwrap_or("?")
        )));
    }
    if let Some(f) = v["partial_rotary_factor"].as_f64().filter(|&f| f != 1.0) {
        return Err(Error::Unsupported(format!(
            "partial rotary embeddings (partial_rotary_factor {f})"
        )));
    }
    Ok(())
}
