//! The PARD drafter as a differentiable candle graph (docs/pard.md): the target family's
//! decoder layers over one sequence's prefix-shared layout — every real token, then the mask
//! chains COD kept — with one range mask per slot. The same network as the runtime's
//! (`drafters::pard`, an ordinary `Model`); RMSNorm and the range softmax are `train::fused`'s
//! (they record a backward), RoPE is composed.

use crate::model::{Arch, Config};
use crate::train::fused::{self, Ranges};
use crate::train::graph::{
    cos_sin, expand_kv, layer_shapes, linear, rms, rope, vars_from, vars_to,
};
use crate::train::run::Vars;
use candle_core::{Device, Tensor};
use std::collections::HashMap;

pub type CResult<T> = candle_core::Result<T>;

pub struct Net {
    /// The drafter's layers (HF layout: rotate-half RoPE).
    pub config: Config,
    pub vars: Vars,
    inv_freq: Vec<f32>,
    device: Device,
}

/// One sequence in the prefix-shared layout.
pub struct Batch {
    /// `[slots, hidden]`: the input embedding of every slot (real tokens, then masks).
    pub x: Tensor,
    pub positions: Vec<u32>,
    /// Visible keys of every slot: the real prefix, then the slot's own mask chain.
    pub ranges: Vec<Ranges>,
    /// Slots whose outputs are scored.
    pub out: Vec<u32>,
}

fn layer_name(i: usize, s: &str) -> String {
    format!("model.layers.{i}.{s}.weight")
}

impl Net {
    /// Every trainable tensor with its shape, in HF naming (what the exported checkpoint holds).
    pub fn shapes(c: &Config) -> Vec<(String, Vec<usize>)> {
        let h = c.hidden_size;
        let mut v = vec![];
        for i in 0..c.n_layers {
            let qk_norm = c.arch == Arch::Qwen3;
            v.extend(layer_shapes(c, h, qk_norm, |s| layer_name(i, s)));
        }
        v.push(("model.norm.weight".into(), vec![h]));
        v
    }

    /// The target's first `config.n_layers` layers and its final norm, in f32: the drafter
    /// PARD adapts is a small model of the target's family, here the target truncated.
    pub fn from_target(config: Config, target: &crate::model::Model) -> CResult<Self> {
        let mut t = HashMap::new();
        for i in 0..config.n_layers {
            let Some(ws) = target.layer_weights_f32(i) else {
                candle_core::bail!("the target has no layer {i}");
            };
            for (name, shape, v) in ws {
                t.insert(
                    format!("model.layers.{i}.{name}.weight"),
                    Tensor::from_vec(v, shape, &Device::Cpu)?,
                );
            }
        }
        let norm = target.output_norm();
        t.insert(
            "model.norm.weight".into(),
            Tensor::from_slice(norm, norm.len(), &Device::Cpu)?,
        );
        Self::from_tensors(config, &t)
    }

    /// Weights from tensors by name (a checkpoint or an exported drafter).
    pub fn from_tensors(config: Config, t: &HashMap<String, Tensor>) -> CResult<Self> {
        let vars = vars_from(Self::shapes(&config), t)?;
        let inv_freq = config.inv_freqs();
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

    /// Final-normed hidden states of the batch's `out` slots, `[out, hidden]`.
    pub fn forward(&self, b: &Batch) -> CResult<Tensor> {
        let c = &self.config;
        let eps = c.rms_eps as f64;
        let (nh, nkv, hd) = (c.n_heads, c.n_kv_heads, c.head_dim);
        let dev = &self.device;
        let n = b.positions.len();
        let scale = 1.0 / (hd as f64).sqrt();
        let (cos, sin) = cos_sin(&self.inv_freq, &b.positions, dev)?;
        let mut x = b.x.to_device(dev)?;
        for i in 0..c.n_layers {
            let w = |s: &str| self.w(&layer_name(i, s));
            let xn = rms(&x, w("input_layernorm"), eps)?;
            let mut q = linear(&xn, w("self_attn.q_proj"))?.reshape((n, nh, hd))?;
            let mut k = linear(&xn, w("self_attn.k_proj"))?.reshape((n, nkv, hd))?;
            let v = linear(&xn, w("self_attn.v_proj"))?.reshape((n, nkv, hd))?;
            if c.arch == Arch::Qwen3 {
                q = rms(&q, w("self_attn.q_norm"), eps)?;
                k = rms(&k, w("self_attn.k_norm"), eps)?;
            }
            let (q, k) = (rope(&q, &cos, &sin)?, rope(&k, &cos, &sin)?);
            let (k, v) = (expand_kv(&k, nh / nkv)?, expand_kv(&v, nh / nkv)?);
            let qh = q.transpose(0, 1)?.contiguous()?; // [nh, n, hd]
            let kt = k.permute((1, 2, 0))?.contiguous()?; // [nh, hd, n]
            let scores = qh.matmul(&kt)?.affine(scale, 0.0)?;
            let p = fused::range_softmax(&scores, &b.ranges)?;
            let o = p
                .matmul(&v.transpose(0, 1)?.contiguous()?)? // [nh, n, hd]
                .transpose(0, 1)?
                .reshape((n, nh * hd))?;
            x = (x + linear(&o, w("self_attn.o_proj"))?)?;
            let xn = rms(&x, w("post_attention_layernorm"), eps)?;
            let g = linear(&xn, w("mlp.gate_proj"))?.silu()?;
            let u = linear(&xn, w("mlp.up_proj"))?;
            x = (x + linear(&(g * u)?, w("mlp.down_proj"))?)?;
        }
        let idx = Tensor::from_vec(b.out.clone(), b.out.len(), dev)?;
        rms(&x.index_select(&idx, 0)?, self.w("model.norm.weight"), eps)
    }
}
