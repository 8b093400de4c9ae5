//! The DFlash draft network at inference (DFlash §3.2, docs/dflash.md): fused target features
//! become per-layer context K/V (KV injection), and a block [bonus, MASK × (B − 1)] attends
//! non-causally over [context ⧺ block]. Weights are dense (f32 in memory, f16/bf16/f32 on disk).

use super::config::DflashConfig;
use crate::drafters::parts::TapFusion;
use crate::drafters::vocab::DraftVocab;
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::layer::{rope_table, Layer, LayerScratch, SeqAttn};
use crate::model::source::{SafetensorsSource, TensorSource};
use crate::runtime::attention::{AttnShape, Visibility};
use crate::runtime::ops;
use crate::types::Pos;
use std::path::Path;

pub struct DflashModel {
    pub config: DflashConfig,
    /// `hidden_norm(fc(taps))`, the injected context feature.
    fusion: TapFusion,
    /// Qwen3 decoder layers (the target's layer code, run non-causally over the block).
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// The draft vocabulary (the whole target vocabulary unless `draft_vocab_size` is set).
    pub vocab: DraftVocab,
    inv_freq: Vec<f32>,
}

/// Reusable buffers of one drafter.
#[derive(Default)]
pub struct Scratch {
    /// Fused context features.
    c: Vec<f32>,
    l: LayerScratch,
    /// The block's all-visible attention mask.
    mask: Vec<bool>,
}

impl DflashModel {
    /// Loads `config.json` + `model.safetensors` from a drafter directory, with Q8_0 weights
    /// (the int8 kernels; see [`DflashModel::load_with`]).
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_with(dir, true)
    }

    /// Loads with Q8_0 weights (`quantize`) or the f32 weights as stored (exact; the
    /// reference the training graph is tested against).
    pub fn load_with(dir: &Path, quantize: bool) -> Result<Self> {
        if !dir.is_dir() {
            return Err(Error::io(
                dir,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "not a DFlash drafter directory (config.json + model.safetensors)",
                ),
            ));
        }
        let config = DflashConfig::load(dir)?;
        let src = SafetensorsSource::open(dir)?;
        let m = Self::from_source(config, &src)?;
        Ok(if quantize { m.quantized() } else { m })
    }

    /// Every matrix in Q8_0 (int8 activations on the VNNI kernels instead of f32 dot products).
    pub fn quantized(mut self) -> Self {
        self.fusion.quantize();
        for l in &mut self.layers {
            l.matrices_mut().into_iter().for_each(|w| w.quantize_q8_0());
        }
        self
    }

    pub fn from_source(config: DflashConfig, src: &SafetensorsSource) -> Result<Self> {
        config.layers.validate()?;
        let c = &config.layers;
        let h = c.hidden_size;
        let width = config.target_layer_ids.len() * h;
        let fusion = TapFusion::load(src, "fc.weight", "hidden_norm.weight", h, width, c.rms_eps)?;
        // Published names: `layers.{i}.self_attn.q_proj.weight` (HF without the `model.` prefix).
        let layers = (0..c.n_layers)
            .map(|i| {
                Layer::load(src, c, true, |s| {
                    let hf = SafetensorsSource::hf_name(&format!("blk.{i}.{s}"));
                    hf.trim_start_matches("model.").to_string()
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let vocab = DraftVocab::load(src, config.draft_vocab_size, c.vocab_size, "DFlash drafter")?;
        let inv_freq = c.inv_freqs();
        Ok(DflashModel {
            fusion,
            norm: src.vector("norm.weight", h)?,
            layers,
            vocab,
            inv_freq,
            config,
        })
    }

    pub fn new_kv(&self, capacity: usize) -> KvCache {
        let c = &self.config.layers;
        KvCache::new(c.n_layers, c.n_kv_heads, c.head_dim, capacity)
    }

    /// Floats of fused target features per position.
    pub fn feature_width(&self) -> usize {
        self.fusion.width()
    }

    /// KV injection: appends the context K/V of `positions` (their target features in
    /// `features`, `positions.len() × feature_width`) to every layer's cache.
    pub fn add_context(
        &self,
        kv: &mut KvCache,
        features: &[f32],
        positions: &[Pos],
        s: &mut Scratch,
    ) -> Result<()> {
        let c = &self.config.layers;
        let n = positions.len();
        if n == 0 {
            return Ok(());
        }
        if features.len() != n * self.feature_width() {
            return Err(Error::BadRequest(format!(
                "DFlash context: {} feature floats for {n} positions of width {}",
                features.len(),
                self.feature_width()
            )));
        }
        let h = c.hidden_size;
        let slot0 = kv.reserve(n)?;
        // c = hidden_norm(fc(concat features)), shared by all layers.
        let l = &mut s.l;
        self.fusion.fuse(features, &mut l.qa, &mut s.c);
        let cx = &s.c[..n * h];
        rope_table(&self.inv_freq, positions, &mut l.rope);
        if let Some(first) = self.layers.first() {
            first.prep_context(cx, l);
        }
        for (li, layer) in self.layers.iter().enumerate() {
            // The layer's own k/v projections (+ k_norm, RoPE); no input norm on the context.
            layer.context_kv(c, li, cx, l, kv, slot0);
        }
        Ok(())
    }

    /// Runs a block whose input embeddings are `x` (`B × hidden`) at `positions` over the
    /// cached context; leaves the final-normed hidden states of all B slots in `out`. The
    /// block's K/V are dropped again (only context K/V persist).
    pub fn block_forward(
        &self,
        kv: &mut KvCache,
        x: &[f32],
        positions: &[Pos],
        s: &mut Scratch,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let c = &self.config.layers;
        let b = positions.len();
        let prefix = kv.len();
        let slot0 = kv.reserve(b)?;
        s.l.x.clear();
        s.l.x.extend_from_slice(x);
        rope_table(&self.inv_freq, positions, &mut s.l.rope);
        s.mask.clear();
        s.mask.resize(b * b, true); // bidirectional inside the block
        let shape = AttnShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            prefix,
            n_new: b,
        };
        for (li, l) in self.layers.iter().enumerate() {
            let mut seq = [SeqAttn {
                kv: &mut *kv,
                slot0,
                shape,
                vis: Visibility::Mask(&s.mask),
                positions,
            }];
            l.forward(c, li, &mut seq, &mut s.l, false);
        }
        kv.truncate(prefix);
        out.resize(b * c.hidden_size, 0.0);
        ops::rms_norm(&s.l.x, &self.norm, c.rms_eps, out);
        Ok(())
    }
}
