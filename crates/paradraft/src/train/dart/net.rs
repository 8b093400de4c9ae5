//! The DART drafter as a differentiable candle graph (docs/dart.md): the same network as
//! `drafters::dart::model`, evaluated over a prefix-shared layout — the clean slots of a whole
//! sequence, then blocks of mask slots for sampled prefixes — in one pass. Every op records a
//! backward (RMSNorm and the range-masked softmax are `train::fused`'s; RoPE is composed).
//! Deeper drafters add plain LLaMA layers `layers.{i}.*` over the first layer's output.

use crate::drafters::dart::DartConfig;
use crate::train::fused::{self, Ranges};
use crate::train::graph::{
    cos_sin, expand_kv, init_vars, layer_shapes, linear, normals, rms, rope, vars_from, vars_to,
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

/// The published name of weight `s` (`"self_attn.q_proj"`) of drafter layer `li`: the paper's
/// layer is `midlayer`, deeper ones `layers.{li}`.
fn layer_weight(li: usize, s: &str) -> String {
    match li {
        0 => format!("midlayer.{s}.weight"),
        _ => format!("layers.{li}.{s}.weight"),
    }
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
        let h = c.hidden_size;
        let mut v = vec![
            ("fc.weight".into(), vec![h, 3 * config.target_hidden_size]),
            ("midlayer.mask_rep".into(), vec![2 * h]),
            ("midlayer.hidden_norm.weight".into(), vec![h]),
        ];
        v.extend(layer_shapes(c, 2 * h, false, |s| layer_weight(0, s)));
        v.extend([
            ("norm.weight".into(), vec![h]),
            ("lm_head.weight".into(), vec![config.draft_vocab_size, h]),
        ]);
        for i in 1..c.n_layers {
            v.extend(layer_shapes(c, h, false, |s| layer_weight(i, s)));
        }
        v
    }

    /// This drafter with `layers` layers in all: the layers it has keep their weights, new
    /// ones start as the identity (their output projections zero, so the drafter's outputs are
    /// unchanged until training moves them; the rest as [`Net::init`], seeded).
    pub fn grow(self, layers: usize, seed: u64) -> CResult<Self> {
        let have = self.config.layer.n_layers;
        if layers < have {
            candle_core::bail!("the drafter has {have} layers; it cannot grow to {layers}");
        }
        let mut config = self.config.clone();
        config.layer.n_layers = layers;
        let mut t: HashMap<String, Tensor> = self
            .vars
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.as_tensor().to_device(&Device::Cpu)?)))
            .collect::<CResult<_>>()?;
        let fresh = init_vars(Self::shapes(&config), seed, |name, n, _| {
            (name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight"))
                .then(|| vec![0f32; n])
        })?;
        for (name, v) in fresh {
            t.entry(name).or_insert_with(|| v.as_tensor().clone());
        }
        Self::from_tensors(config, &t)?.to_device(&self.device)
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
        let h = c.hidden_size;
        let dev = &self.device;
        // Real slots: residual g = fc(taps), input [norm(e) ; norm(g)]; masks: mask_rep.
        let g = linear(&b.features.to_device(dev)?, self.w("fc.weight"))?;
        let ue = rms(
            &b.next_emb.to_device(dev)?,
            self.w(&layer_weight(0, "input_layernorm")),
            eps,
        )?;
        let ug = rms(&g, self.w("midlayer.hidden_norm.weight"), eps)?;
        let rep = self.w("midlayer.mask_rep");
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
        let idx = Tensor::from_vec(b.out.clone(), b.out.len(), dev)?;
        let mut x = resid;
        for li in 0..c.n_layers {
            let p = |s: &str| layer_weight(li, s);
            if li > 0 {
                u = rms(&x, self.w(&p("input_layernorm")), eps)?;
            }
            let o = self.attention(&u, &p, (&cos, &sin), &b.ranges)?;
            x = (x + linear(&o, self.w(&p("self_attn.o_proj")))?)?;
            if li + 1 == c.n_layers {
                // Rows are independent from here on: only the scored ones continue.
                x = x.index_select(&idx, 0)?;
            }
            let xn = rms(&x, self.w(&p("post_attention_layernorm")), eps)?;
            let gate = linear(&xn, self.w(&p("mlp.gate_proj")))?.silu()?;
            let up = linear(&xn, self.w(&p("mlp.up_proj")))?;
            x = (x + linear(&(gate * up)?, self.w(&p("mlp.down_proj")))?)?;
        }
        // The reference's double final norm (see `drafters::dart::model`).
        let nw = self.w("norm.weight");
        let y = rms(&rms(&x, nw, eps)?, nw, eps)?;
        linear(&y, self.w("lm_head.weight"))
    }

    /// One layer's causal attention over the inputs `u` (`[n, in]`), before its output
    /// projection: `[n, heads × head_dim]`. `p` names the layer's weights.
    fn attention(
        &self,
        u: &Tensor,
        p: &dyn Fn(&str) -> String,
        (cos, sin): (&Tensor, &Tensor),
        ranges: &[Ranges],
    ) -> CResult<Tensor> {
        let c = &self.config.layer;
        let (nh, nkv, hd) = (c.n_heads, c.n_kv_heads, c.head_dim);
        let n = u.dim(0)?;
        let q = linear(u, self.w(&p("self_attn.q_proj")))?.reshape((n, nh, hd))?;
        let k = linear(u, self.w(&p("self_attn.k_proj")))?.reshape((n, nkv, hd))?;
        let v = linear(u, self.w(&p("self_attn.v_proj")))?.reshape((n, nkv, hd))?;
        let (q, k) = (rope(&q, cos, sin)?, rope(&k, cos, sin)?);
        let (k, v) = (expand_kv(&k, nh / nkv)?, expand_kv(&v, nh / nkv)?);
        let qh = q.transpose(0, 1)?.contiguous()?; // [nh, n, hd]
        let kt = k.permute((1, 2, 0))?.contiguous()?; // [nh, hd, n]
        let scores = qh.matmul(&kt)?.affine(1.0 / (hd as f64).sqrt(), 0.0)?;
        let a = fused::range_softmax(&scores, ranges)?;
        a.matmul(&v.transpose(0, 1)?.contiguous()?)? // [nh, n, hd]
            .transpose(0, 1)?
            .reshape((n, nh * hd))
    }
}
