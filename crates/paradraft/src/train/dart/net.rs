//! The DART drafter as a differentiable candle graph (spec §2.1 and §2.7): the same network as
//! `drafters::dart::model`, evaluated over a prefix-shared layout — the clean slots of a whole
//! sequence, then blocks of mask slots for sampled prefixes — in one pass. Every op records a
//! backward (RMSNorm and the range-masked softmax are `train::fused`'s; RoPE is composed).

use crate::drafters::dart::DartConfig;
use crate::train::fused::{self, Ranges};
use crate::train::graph::{
    cos_sin, expand_kv, init_vars, linear, normals, rms, rope, vars_from, vars_to,
};
use crate::train::run::Vars;
use candle_core::{Device, Tensor};
use std::collections::HashMap;

pub type CResult<T> = candle_core::Result<T>;

pub struct Net {
    pub config: DartConfig,
    pub vars: Vars,
    inv_freq: Vec<f32>,
    device: Device,
}

/// One sequence in the prefix-shared layout: `clean` slots (slot i holds the target's taps at
/// position i and the embedding of token i + 1), then mask slots. Only the `out` rows go
/// through the MLP and the head.
pub struct Batch {
    /// `[clean, 3 × target_hidden]`.
    pub features: Tensor,
    /// `[clean, hidden]` target embeddings of the tokens one to the right.
    pub next_emb: Tensor,
    pub masks: usize,
    /// Position of every slot (clean, then masks).
    pub positions: Vec<u32>,
    /// Visible keys of every slot.
    pub ranges: Vec<Ranges>,
    /// Slots whose outputs are scored.
    pub out: Vec<u32>,
}

impl Net {
    /// Every trainable tensor with its shape, in the published naming.
    pub fn shapes(config: &DartConfig) -> Vec<(String, Vec<usize>)> {
        let c = &config.layer;
        let (h, hd, ff) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (qd, kvd) = (c.n_heads * hd, c.n_kv_heads * hd);
        let m = |s: &str| format!("midlayer.{s}");
        vec![
            ("fc.weight".into(), vec![h, 3 * config.target_hidden_size]),
            (m("mask_rep"), vec![2 * h]),
            (m("hidden_norm.weight"), vec![h]),
            (m("input_layernorm.weight"), vec![h]),
            (m("post_attention_layernorm.weight"), vec![h]),
            (m("self_attn.q_proj.weight"), vec![qd, 2 * h]),
            (m("self_attn.k_proj.weight"), vec![kvd, 2 * h]),
            (m("self_attn.v_proj.weight"), vec![kvd, 2 * h]),
            (m("self_attn.o_proj.weight"), vec![h, qd]),
            (m("mlp.gate_proj.weight"), vec![ff, h]),
            (m("mlp.up_proj.weight"), vec![ff, h]),
            (m("mlp.down_proj.weight"), vec![h, ff]),
            ("norm.weight".into(), vec![h]),
            ("lm_head.weight".into(), vec![config.draft_vocab_size, h]),
        ]
    }

    /// Fresh weights: matrices N(0, 0.02²), norms 1, `mask_rep` N(0, 1) (the scale of a
    /// normed input), seeded. `head`, when given (`draft_vocab × hidden`), starts the LM head.
    pub fn init(config: DartConfig, seed: u64, head: Option<Vec<f32>>) -> CResult<Self> {
        let mut head = head;
        let vars = init_vars(Self::shapes(&config), seed, |name, n, rng| {
            if name == "lm_head.weight" && head.as_ref().is_some_and(|h| h.len() == n) {
                head.take()
            } else if name.ends_with("mask_rep") {
                Some(normals(rng, n, 1.0))
            } else {
                None
            }
        })?;
        let inv_freq = config.layer.inv_freqs();
        Ok(Net {
            config,
            vars,
            inv_freq,
            device: Device::Cpu,
        })
    }

    /// Weights from tensors by name (a checkpoint or an exported drafter).
    pub fn from_tensors(config: DartConfig, t: &HashMap<String, Tensor>) -> CResult<Self> {
        let vars = vars_from(Self::shapes(&config), t)?;
        let inv_freq = config.layer.inv_freqs();
        Ok(Net {
            config,
            vars,
            inv_freq,
            device: Device::Cpu,
        })
    }

    pub fn to_device(self, dev: &Device) -> CResult<Self> {
        Ok(Net {
            vars: vars_to(self.vars, dev)?,
            device: dev.clone(),
            ..self
        })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    fn w(&self, name: &str) -> &Tensor {
        self.vars[name].as_tensor()
    }

    /// Logits over the draft vocabulary of the batch's `out` slots, `[out, draft_vocab]`.
    pub fn forward(&self, b: &Batch) -> CResult<Tensor> {
        let c = &self.config.layer;
        let eps = c.rms_eps as f64;
        let (nh, nkv, hd, h) = (c.n_heads, c.n_kv_heads, c.head_dim, c.hidden_size);
        let dev = &self.device;
        let clean = b.features.dim(0)?;
        let n = clean + b.masks;
        let m = |s: &str| format!("midlayer.{s}");
        // Real slots: residual g = fc(taps), input [norm(e) ; norm(g)]; masks: mask_rep.
        let g = linear(&b.features.to_device(dev)?, self.w("fc.weight"))?;
        let ue = rms(
            &b.next_emb.to_device(dev)?,
            self.w(&m("input_layernorm.weight")),
            eps,
        )?;
        let ug = rms(&g, self.w(&m("hidden_norm.weight")), eps)?;
        let rep = self.w(&m("mask_rep"));
        let mut u = Tensor::cat(&[ue, ug], 1)?;
        let mut resid = g;
        if b.masks > 0 {
            let ru = rep.unsqueeze(0)?.broadcast_as((b.masks, 2 * h))?;
            u = Tensor::cat(&[u, ru.contiguous()?], 0)?;
            let rr = rep
                .narrow(0, 0, h)?
                .unsqueeze(0)?
                .broadcast_as((b.masks, h))?;
            resid = Tensor::cat(&[resid, rr.contiguous()?], 0)?;
        }
        let (cos, sin) = cos_sin(&self.inv_freq, &b.positions, dev)?;
        let q = linear(&u, self.w(&m("self_attn.q_proj.weight")))?.reshape((n, nh, hd))?;
        let k = linear(&u, self.w(&m("self_attn.k_proj.weight")))?.reshape((n, nkv, hd))?;
        let v = linear(&u, self.w(&m("self_attn.v_proj.weight")))?.reshape((n, nkv, hd))?;
        let (q, k) = (rope(&q, &cos, &sin)?, rope(&k, &cos, &sin)?);
        let (k, v) = (expand_kv(&k, nh / nkv)?, expand_kv(&v, nh / nkv)?);
        let qh = q.transpose(0, 1)?.contiguous()?; // [nh, n, hd]
        let kt = k.permute((1, 2, 0))?.contiguous()?; // [nh, hd, n]
        let scores = qh.matmul(&kt)?.affine(1.0 / (hd as f64).sqrt(), 0.0)?;
        let p = fused::range_softmax(&scores, &b.ranges)?;
        let o = p
            .matmul(&v.transpose(0, 1)?.contiguous()?)? // [nh, n, hd]
            .transpose(0, 1)?
            .reshape((n, nh * hd))?;
        let x = (resid + linear(&o, self.w(&m("self_attn.o_proj.weight")))?)?;
        // Rows are independent from here on: only the scored ones continue.
        let idx = Tensor::from_vec(b.out.clone(), b.out.len(), dev)?;
        let x = x.index_select(&idx, 0)?;
        let xn = rms(&x, self.w(&m("post_attention_layernorm.weight")), eps)?;
        let gate = linear(&xn, self.w(&m("mlp.gate_proj.weight")))?.silu()?;
        let up = linear(&xn, self.w(&m("mlp.up_proj.weight")))?;
        let x = (x + linear(&(gate * up)?, self.w(&m("mlp.down_proj.weight")))?)?;
        // The reference's double final norm (see `drafters::dart::model`).
        let nw = self.w("norm.weight");
        let y = rms(&rms(&x, nw, eps)?, nw, eps)?;
        linear(&y, self.w("lm_head.weight"))
    }
}
