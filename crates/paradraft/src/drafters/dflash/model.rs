//! The DFlash draft network at inference (DFlash §3.2, spec §3.1): fused target features
//! become per-layer context K/V (KV injection), and a block [bonus, MASK × (B − 1)] attends
//! non-causally over [context ⧺ block]. Weights are dense (f32 in memory, f16/bf16/f32 on disk).

use super::config::DflashConfig;
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::source::{SafetensorsSource, TensorSource};
use crate::runtime::ops::{self, AttnShape, Visibility};
use crate::runtime::qmatmul::QActs;
use crate::runtime::quant::{prep_acts, sized, Matrix};
use crate::types::Pos;
use std::path::Path;

struct Layer {
    in_norm: Vec<f32>,
    post_norm: Vec<f32>,
    wq: Matrix,
    wk: Matrix,
    wv: Matrix,
    wo: Matrix,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    w_gate: Matrix,
    w_up: Matrix,
    w_down: Matrix,
}

pub struct DflashModel {
    pub config: DflashConfig,
    fc: Matrix,
    hidden_norm: Vec<f32>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// Target id of each draft-vocabulary id (reduced vocabulary only).
    pub draft_to_target: Option<Vec<u32>>,
    inv_freq: Vec<f32>,
}

/// Reusable buffers of one drafter.
#[derive(Default)]
pub struct Scratch {
    c: Vec<f32>,
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    rope: Vec<(f32, f32)>,
    mask: Vec<bool>,
    qa: QActs,
}

/// Quantizes `x` into `qa` when `m` takes int8 activations.
fn prep(qa: &mut QActs, m: &Matrix, x: &[f32]) {
    prep_acts(qa, &[m], x, false);
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
        let q =
            |m: &mut Matrix| *m = std::mem::replace(m, Matrix::from_f32(0, 0, vec![])).to_q8_0();
        q(&mut self.fc);
        for l in &mut self.layers {
            for m in [
                &mut l.wq,
                &mut l.wk,
                &mut l.wv,
                &mut l.wo,
                &mut l.w_gate,
                &mut l.w_up,
                &mut l.w_down,
            ] {
                q(m);
            }
        }
        self
    }

    pub fn from_source(config: DflashConfig, src: &SafetensorsSource) -> Result<Self> {
        config.layers.validate()?;
        let c = &config.layers;
        let (h, hd, ff) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (qd, kvd) = (c.n_heads * hd, c.n_kv_heads * hd);
        let width = config.target_layer_ids.len() * h;
        let fc = src.matrix("fc.weight", h, width)?;
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let n = |s: &str| format!("layers.{i}.{s}.weight");
            layers.push(Layer {
                in_norm: src.vector(&n("input_layernorm"), h)?,
                post_norm: src.vector(&n("post_attention_layernorm"), h)?,
                wq: src.matrix(&n("self_attn.q_proj"), qd, h)?,
                wk: src.matrix(&n("self_attn.k_proj"), kvd, h)?,
                wv: src.matrix(&n("self_attn.v_proj"), kvd, h)?,
                wo: src.matrix(&n("self_attn.o_proj"), h, qd)?,
                q_norm: src.vector(&n("self_attn.q_norm"), hd)?,
                k_norm: src.vector(&n("self_attn.k_norm"), hd)?,
                w_gate: src.matrix(&n("mlp.gate_proj"), ff, h)?,
                w_up: src.matrix(&n("mlp.up_proj"), ff, h)?,
                w_down: src.matrix(&n("mlp.down_proj"), h, ff)?,
            });
        }
        let draft_to_target = match config.draft_vocab_size {
            None => None,
            Some(n) => {
                let bad = |reason: String| Error::BadModelFile {
                    path: src.describe().into(),
                    format: "DFlash drafter",
                    reason,
                };
                let d2t = src.int_tensor("d2t").ok_or_else(|| {
                    bad("draft_vocab_size is set but tensor d2t is missing".into())
                })?;
                if d2t.len() != n {
                    return Err(bad(format!("d2t has {} entries, expected {n}", d2t.len())));
                }
                let ids = d2t
                    .iter()
                    .enumerate()
                    .map(|(i, &o)| {
                        let t = i as i64 + o;
                        (0..c.vocab_size as i64)
                            .contains(&t)
                            .then_some(t as u32)
                            .ok_or_else(|| bad(format!("d2t[{i}] maps outside the vocabulary")))
                    })
                    .collect::<Result<Vec<u32>>>()?;
                Some(ids)
            }
        };
        let inv_freq = c.inv_freqs();
        Ok(DflashModel {
            fc,
            hidden_norm: src.vector("hidden_norm.weight", h)?,
            norm: src.vector("norm.weight", h)?,
            layers,
            draft_to_target,
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
        self.fc.cols
    }

    fn rope_table(&self, positions: &[Pos], out: &mut Vec<(f32, f32)>) {
        out.clear();
        for p in positions {
            for &f in &self.inv_freq {
                let a = p.0 as f32 * f;
                out.push((a.cos(), a.sin()));
            }
        }
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
        let (h, hd) = (c.hidden_size, c.head_dim);
        let kvd = c.n_kv_heads * hd;
        let slot0 = kv.reserve(n)?;
        // c = hidden_norm(fc(concat features)), shared by all layers.
        let cx = sized(&mut s.c, n * h);
        prep(&mut s.qa, &self.fc, features);
        self.fc.matmul(features, &s.qa, cx);
        ops::rms_norm_inplace(cx, &self.hidden_norm, c.rms_eps);
        self.rope_table(positions, &mut s.rope);
        let half = hd / 2;
        let row = kv.row();
        if let Some(l) = self.layers.first() {
            prep(&mut s.qa, &l.wk, &s.c);
        }
        for (li, l) in self.layers.iter().enumerate() {
            // The layer's own k/v projections, no input norm on the context.
            let k = sized(&mut s.k, n * kvd);
            let v = sized(&mut s.v, n * kvd);
            Matrix::matmul_many(&mut [(&l.wk, &mut *k), (&l.wv, &mut *v)], &s.c, &s.qa);
            ops::rms_norm_inplace(k, &l.k_norm, c.rms_eps);
            for t in 0..n {
                let cs = &s.rope[t * half..(t + 1) * half];
                ops::rope(&mut k[t * kvd..(t + 1) * kvd], hd, cs, c.rope_style);
            }
            kv.k[li][slot0 * row..(slot0 + n) * row].copy_from_slice(k);
            kv.v[li][slot0 * row..(slot0 + n) * row].copy_from_slice(v);
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
        let (h, hd, ff) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (qd, kvd) = (c.n_heads * hd, c.n_kv_heads * hd);
        let prefix = kv.len();
        let slot0 = kv.reserve(b)?;
        s.x.clear();
        s.x.extend_from_slice(x);
        self.rope_table(positions, &mut s.rope);
        s.mask.clear();
        s.mask.resize(b * b, true); // bidirectional inside the block
        let shape = AttnShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
            prefix,
            n_new: b,
        };
        let half = hd / 2;
        let row = kv.row();
        for (li, l) in self.layers.iter().enumerate() {
            let xn = sized(&mut s.xn, b * h);
            ops::rms_norm(&s.x, &l.in_norm, c.rms_eps, xn);
            prep(&mut s.qa, &l.wq, xn);
            let q = sized(&mut s.q, b * qd);
            let k = sized(&mut s.k, b * kvd);
            let v = sized(&mut s.v, b * kvd);
            Matrix::matmul_many(
                &mut [(&l.wq, &mut *q), (&l.wk, &mut *k), (&l.wv, &mut *v)],
                xn,
                &s.qa,
            );
            ops::rms_norm_inplace(q, &l.q_norm, c.rms_eps);
            ops::rms_norm_inplace(k, &l.k_norm, c.rms_eps);
            for t in 0..b {
                let cs = &s.rope[t * half..(t + 1) * half];
                ops::rope(&mut q[t * qd..(t + 1) * qd], hd, cs, c.rope_style);
                ops::rope(&mut k[t * kvd..(t + 1) * kvd], hd, cs, c.rope_style);
            }
            kv.k[li][slot0 * row..(slot0 + b) * row].copy_from_slice(k);
            kv.v[li][slot0 * row..(slot0 + b) * row].copy_from_slice(v);
            let attn = sized(&mut s.attn, b * qd);
            let end = (slot0 + b) * row;
            ops::attention(
                q,
                &kv.k[li][..end],
                &kv.v[li][..end],
                &shape,
                Visibility::Mask(&s.mask),
                attn,
            );
            let proj = sized(&mut s.proj, b * h);
            prep(&mut s.qa, &l.wo, attn);
            l.wo.matmul(attn, &s.qa, proj);
            ops::add_inplace(&mut s.x, proj);
            let xn = sized(&mut s.xn, b * h);
            ops::rms_norm(&s.x, &l.post_norm, c.rms_eps, xn);
            let gate = sized(&mut s.gate, b * ff);
            let up = sized(&mut s.up, b * ff);
            prep(&mut s.qa, &l.w_gate, xn);
            Matrix::matmul_many(
                &mut [(&l.w_gate, &mut *gate), (&l.w_up, &mut *up)],
                xn,
                &s.qa,
            );
            ops::silu_mul(gate, up);
            let proj = sized(&mut s.proj, b * h);
            prep(&mut s.qa, &l.w_down, gate);
            l.w_down.matmul(gate, &s.qa, proj);
            ops::add_inplace(&mut s.x, proj);
        }
        kv.truncate(prefix);
        out.resize(b * h, 0.0);
        ops::rms_norm(&s.x, &self.norm, c.rms_eps, out);
        Ok(())
    }
}
