//! Phi-3 (mini / medium, 4K context): the Llama layer with fused projections — one q/k/v matrix
//! (`attn_qkv`, HF `qkv_proj`) and one gate/up matrix (`ffn_up` of twice the MLP width, HF
//! `gate_up_proj`, the gate's rows first). [`Fused`] serves the separate matrices as row ranges
//! of the fused ones, exactly (a quantized row is self-contained), so the layer code is the
//! Llama one. LongRoPE (the 128K variants, Phi-3.5-mini) is read from either format; partial
//! rotary embeddings (Phi-4-mini) are refused by name.

use super::config::{Config, RopeScaling};
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

/// LongRoPE from a GGUF file as llama.cpp's converter writes it: `rope_factors_short` /
/// `rope_factors_long` tensors, `<arch>.rope.scaling.original_context_length` and
/// `.attn_factor` (1 when absent, as llama.cpp reads it); `None` without the factors.
pub(crate) fn gguf_longrope(
    g: &GgufFile,
    arch: &str,
    rope_dims: usize,
) -> Result<Option<RopeScaling>> {
    let (Some(s), Some(l)) = (
        g.tensors.get("rope_factors_short.weight"),
        g.tensors.get("rope_factors_long.weight"),
    ) else {
        if g.has("rope_factors_long.weight") || g.has("rope_factors_short.weight") {
            return Err(Error::Unsupported(
                "LongRoPE with only one of rope_factors_short / rope_factors_long".into(),
            ));
        }
        return Ok(None);
    };
    let read = |t: &super::gguf::TensorInfo| -> Result<Vec<f32>> {
        if t.dims.iter().product::<usize>() != rope_dims / 2 {
            return Err(Error::Unsupported(format!(
                "LongRoPE factors of {:?} for {rope_dims} rotated dimensions per head",
                t.dims
            )));
        }
        let mut v = vec![0f32; rope_dims / 2];
        crate::runtime::quant::dequantize(t.dtype, g.data(t), &mut v);
        Ok(v)
    };
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    let original = g
        .u64(&key("original_context_length"))
        .ok_or_else(|| g.missing(&key("original_context_length")))? as usize;
    Ok(Some(RopeScaling::LongRope {
        short: read(s)?,
        long: read(l)?,
        original,
        attn_factor: g.f64(&key("attn_factor")).unwrap_or(1.0) as f32,
    }))
}

/// LongRoPE from an HF config's rope parameters `rs` (`short_factor`, `long_factor`, the
/// original context, the attention factor or transformers' default for it:
/// √(1 + ln s / ln original) with s = max positions / original, 1 when s ≤ 1).
pub(crate) fn hf_longrope(v: &serde_json::Value, rs: &serde_json::Value) -> Result<RopeScaling> {
    let bad = |m: String| Error::Unsupported(format!("LongRoPE: {m}"));
    let factors = |k: &str| -> Result<Vec<f32>> {
        rs[k]
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_f64().map(|f| f as f32)).collect())
            .ok_or_else(|| bad(format!("{k} must be a list of numbers")))
    };
    let original = rs["original_max_position_embeddings"]
        .as_u64()
        .or(v["original_max_position_embeddings"].as_u64())
        .ok_or_else(|| bad("no original_max_position_embeddings".into()))?;
    let max_pos = v["max_position_embeddings"].as_u64().unwrap_or(original) as f64;
    let attn_factor = match rs["attention_factor"].as_f64() {
        Some(a) => a,
        None => {
            let s = max_pos / original as f64;
            if s <= 1.0 {
                1.0
            } else {
                (1.0 + s.ln() / (original as f64).ln()).sqrt()
            }
        }
    };
    Ok(RopeScaling::LongRope {
        short: factors("short_factor")?,
        long: factors("long_factor")?,
        original: original as usize,
        attn_factor: attn_factor as f32,
    })
}

/// The rotated dimensions per head of a Phi-3 GGUF (`phi3.rope.dimension_count`; Phi-4-mini
/// rotates 96 of 128), `None` when it rotates them all.
pub(crate) fn gguf_rotary(g: &GgufFile, head_dim: usize) -> Option<usize> {
    g.u64("phi3.rope.dimension_count")
        .map(|n| n as usize)
        .filter(|&n| n != head_dim)
}

/// The same for an HF `phi3` config (`partial_rotary_factor`, the fraction of each head).
pub(crate) fn hf_rotary(v: &serde_json::Value, head_dim: usize) -> Option<usize> {
    let f = v["partial_rotary_factor"]
        .as_f64()
        .or(v["rope_parameters"]["partial_rotary_factor"].as_f64())?;
    let n = (head_dim as f64 * f) as usize;
    (n != head_dim).then_some(n)
}
