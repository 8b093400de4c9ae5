//! The DFlash drafter as a differentiable candle graph (docs/dflash.md): the same network
//! as `drafters::dflash::model`, evaluated for many anchor blocks of a packed batch at once
//! with the training attention pattern. Every op here records a backward: RMSNorm and the
//! block-masked softmax are the fused ops of `train::fused` (candle's own fused `rms_norm` and
//! `softmax_last_dim` have no backward), RoPE is written out from primitive ops.

use crate::drafters::dflash::DflashConfig;
use crate::train::graph::{
    cos_sin, expand_kv, init_vars, layer_shapes, linear, rms, rope, vars_from, vars_to,
};
use candle_core::{CpuStorage, CustomOp1, Device, Layout, Shape, Tensor, Var};
use std::collections::BTreeMap;

pub type CResult<T> = candle_core::Result<T>;

/// Trainable weights by checkpoint name (the published DFlash names).
pub struct Net {
    pub config: DflashConfig,
    pub vars: BTreeMap<String, Var>,
    inv_freq: Vec<f32>,
    device: Device,
}

/// The target's LM head rows (frozen): forward `h Wᵀ`, backward only into `h` (candle's matmul
/// backward would also form the unused weight gradient, as large as the head itself).
pub struct FrozenHead {
    /// `[vocab, hidden]`.
    pub w: Tensor,
    /// `[hidden, vocab]`, contiguous.
    wt: Tensor,
    /// The target's final norm (weights, ε), to score its last-layer outputs.
    target_norm: Option<(Tensor, f64)>,
}

impl FrozenHead {
    pub fn new(w: Tensor) -> CResult<Self> {
        let wt = w.t()?.contiguous()?;
        Ok(FrozenHead {
            w,
            wt,
            target_norm: None,
        })
    }

    /// Also scores the target's own last-layer outputs (its final norm, then these rows).
    pub fn with_target_norm(mut self, norm: &[f32], eps: f32) -> CResult<Self> {
        let t = Tensor::from_slice(norm, norm.len(), self.w.device())?;
        self.target_norm = Some((t, eps as f64));
        Ok(self)
    }

    /// The target's logits over the head's rows for last-layer outputs `h` (no gradient); in
    /// bf16 products where training matmuls are (`train::bf16`).
    pub fn target_logits(&self, h: &Tensor) -> CResult<Tensor> {
        let Some((w, eps)) = &self.target_norm else {
            candle_core::bail!("the head has no target norm");
        };
        let x = rms(&h.detach(), w, *eps)?;
        if x.device().is_cpu() && x.rank() == 2 && crate::train::bf16::active() {
            return crate::train::bf16::linear(&x, &self.w);
        }
        x.matmul(&self.wt)
    }
    pub fn forward(&self, h: &Tensor) -> CResult<Tensor> {
        if !h.device().is_cpu() {
            // Off the CPU: a plain matmul (its backward also forms the unused weight gradient).
            return h.matmul(&self.wt);
        }
        h.apply_op1(HeadOp {
            w: self.w.clone(),
            wt: self.wt.clone(),
        })
    }

    /// The same head on `dev`.
    pub fn to_device(self, dev: &Device) -> CResult<Self> {
        Ok(FrozenHead {
            w: self.w.to_device(dev)?,
            wt: self.wt.to_device(dev)?,
            target_norm: match self.target_norm {
                Some((t, eps)) => Some((t.to_device(dev)?, eps)),
                None => None,
            },
        })
    }
}

struct HeadOp {
    w: Tensor,
    wt: Tensor,
}

impl CustomOp1 for HeadOp {
    fn name(&self) -> &'static str {
        "frozen-head"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> CResult<(CpuStorage, Shape)> {
        let (n, h) = l.shape().dims2()?;
        let x = match l.contiguous_offsets() {
            Some((a, b)) => Tensor::from_slice(&s.as_slice::<f32>()?[a..b], (n, h), &Device::Cpu)?,
            None => candle_core::bail!("frozen-head wants a contiguous input"),
        };
        let y = x.matmul(&self.wt)?;
        let (st, _) = y.storage_and_layout();
        match &*st {
            candle_core::Storage::Cpu(c) => Ok((c.clone(), y.shape().clone())),
            _ => candle_core::bail!("frozen-head runs on the CPU"),
        }
    }
    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> CResult<Option<Tensor>> {
        Ok(Some(grad.matmul(&self.w)?))
    }
}

/// The blocks of one sequence (see `super::batch`).
pub struct Batch {
    /// `[S, taps × hidden]` target features of every context slot.
    pub features: Tensor,
    /// Position of each context slot within its sequence.
    pub ctx_pos: Vec<u32>,
    /// `[A × B, hidden]` block inputs (anchor token, then masks), from the target embedding.
    pub block_x: Tensor,
    /// Position of each block slot.
    pub block_pos: Vec<u32>,
    /// Blocks.
    pub n_blocks: usize,
    pub block: usize,
}

impl Batch {
    /// Context slots block `j` sees: those strictly before its anchor (its first position).
    pub fn visible(&self) -> Vec<usize> {
        (0..self.n_blocks)
            .map(|j| (self.block_pos[j * self.block] as usize).min(self.ctx_pos.len()))
            .collect()
    }
}

impl Net {
    /// Fresh weights: matrices N(0, 0.02²), norms 1 (the HF initialisation), seeded.
    pub fn init(config: DflashConfig, seed: u64) -> CResult<Self> {
        let vars = init_vars(Self::shapes(&config), seed, |_, _, _| None)?;
        let inv_freq = config.layers.inv_freqs();
        Ok(Net {
            config,
            vars,
            inv_freq,
            device: Device::Cpu,
        })
    }

    /// The network with its weights moved to `dev`.
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

    /// Fresh weights as [`Net::init`], then each draft layer `i` takes the weights of target
    /// layer `layers[i]` where names and shapes match (projections, MLP, norms; the fusion `fc`
    /// stays random), and the final norm takes `final_norm`. Returns the names copied.
    pub fn init_from_target(
        config: DflashConfig,
        seed: u64,
        target: &crate::model::Model,
        layers: &[usize],
    ) -> CResult<(Self, Vec<String>)> {
        let net = Self::init(config, seed)?;
        let mut copied = vec![];
        for (i, &li) in layers.iter().enumerate() {
            let Some(ws) = target.layer_weights_f32(li) else {
                candle_core::bail!("the target has no layer {li}");
            };
            for (name, shape, v) in ws {
                let key = format!("layers.{i}.{name}.weight");
                if let Some(var) = net.vars.get(&key) {
                    if var.dims() == shape.as_slice() {
                        var.set(&Tensor::from_vec(v, shape, &Device::Cpu)?)?;
                        copied.push(key);
                    }
                }
            }
        }
        let norm = target.output_norm();
        if let Some(var) = net.vars.get("norm.weight") {
            if var.dims() == [norm.len()] {
                var.set(&Tensor::from_slice(norm, norm.len(), &Device::Cpu)?)?;
                copied.push("norm.weight".into());
            }
        }
        Ok((net, copied))
    }

    /// Weights from tensors by name (a checkpoint); every expected tensor must be present.
    pub fn from_tensors(
        config: DflashConfig,
        t: &std::collections::HashMap<String, Tensor>,
    ) -> CResult<Self> {
        let vars = vars_from(Self::shapes(&config), t)?;
        let inv_freq = config.layers.inv_freqs();
        Ok(Net {
            config,
            vars,
            inv_freq,
            device: Device::Cpu,
        })
    }

    /// Every trainable tensor with its shape, in the checkpoint naming.
    pub fn shapes(config: &DflashConfig) -> Vec<(String, Vec<usize>)> {
        let c = &config.layers;
        let h = c.hidden_size;
        let width = config.target_layer_ids.len() * h;
        let mut v = vec![
            ("fc.weight".to_string(), vec![h, width]),
            ("hidden_norm.weight".to_string(), vec![h]),
            ("norm.weight".to_string(), vec![h]),
        ];
        for i in 0..c.n_layers {
            v.extend(layer_shapes(c, h, true, |s| {
                format!("layers.{i}.{s}.weight")
            }));
        }
        v
    }

    fn w(&self, name: &str) -> &Tensor {
        self.vars[name].as_tensor()
    }

    fn cos_sin(&self, pos: &[u32]) -> CResult<(Tensor, Tensor)> {
        cos_sin(&self.inv_freq, pos, &self.device)
    }

    /// Final-normed hidden states of every block slot, `[A × B, hidden]`.
    pub fn forward(&self, b: &Batch) -> CResult<Tensor> {
        let c = &self.config.layers;
        let eps = c.rms_eps as f64;
        let (nh, nkv, hd) = (c.n_heads, c.n_kv_heads, c.head_dim);
        let groups = nh / nkv;
        let s_len = b.ctx_pos.len();
        let (na, bs) = (b.n_blocks, b.block);
        let n = na * bs;
        let scale = 1.0 / (hd as f64).sqrt();
        let dev = &self.device;
        let ctx = rms(
            &linear(&b.features.to_device(dev)?, self.w("fc.weight"))?,
            self.w("hidden_norm.weight"),
            eps,
        )?;
        let (cos_c, sin_c) = self.cos_sin(&b.ctx_pos)?;
        let (cos_b, sin_b) = self.cos_sin(&b.block_pos)?;
        let visible = b.visible();
        let mut x = b.block_x.to_device(dev)?;
        for i in 0..c.n_layers {
            let w = |s: &str| self.w(&format!("layers.{i}.{s}.weight"));
            // Context K/V: the layer's k/v projections of the fused features (no input norm).
            let ck = linear(&ctx, w("self_attn.k_proj"))?.reshape((s_len, nkv, hd))?;
            let ck = rope(&rms(&ck, w("self_attn.k_norm"), eps)?, &cos_c, &sin_c)?;
            let cv = linear(&ctx, w("self_attn.v_proj"))?.reshape((s_len, nkv, hd))?;
            // Block Q/K/V.
            let xn = rms(&x, w("input_layernorm"), eps)?;
            let q = linear(&xn, w("self_attn.q_proj"))?.reshape((n, nh, hd))?;
            let q = rope(&rms(&q, w("self_attn.q_norm"), eps)?, &cos_b, &sin_b)?;
            let bk = linear(&xn, w("self_attn.k_proj"))?.reshape((n, nkv, hd))?;
            let bk = rope(&rms(&bk, w("self_attn.k_norm"), eps)?, &cos_b, &sin_b)?;
            let bv = linear(&xn, w("self_attn.v_proj"))?.reshape((n, nkv, hd))?;
            let (ck, cv) = (expand_kv(&ck, groups)?, expand_kv(&cv, groups)?);
            let (bk, bv) = (expand_kv(&bk, groups)?, expand_kv(&bv, groups)?);
            // Scores against the context: [nh, N, S], masked per block.
            let qh = q.transpose(0, 1)?.contiguous()?; // [nh, N, hd]
            let s_ctx = qh
                .matmul(&ck.permute((1, 2, 0))?.contiguous()?)?
                .affine(scale, 0.0)?;
            // Scores inside each block (bidirectional): [nh, A, B, B].
            let qb = q
                .reshape((na, bs, nh, hd))?
                .permute((2, 0, 1, 3))?
                .contiguous()?;
            let kb = bk
                .reshape((na, bs, nh, hd))?
                .permute((2, 0, 3, 1))?
                .contiguous()?;
            let s_blk = qb.matmul(&kb)?.affine(scale, 0.0)?;
            let scores = Tensor::cat(&[s_ctx.reshape((nh, na, bs, s_len))?, s_blk], 3)?;
            let p = crate::train::fused::block_softmax(&scores, &visible)?;
            let p_ctx = p.narrow(3, 0, s_len)?.reshape((nh, n, s_len))?;
            let o_ctx = p_ctx.matmul(&cv.transpose(0, 1)?.contiguous()?)?; // [nh, N, hd]
            let vb = bv
                .reshape((na, bs, nh, hd))?
                .permute((2, 0, 1, 3))?
                .contiguous()?;
            let o_blk = p.narrow(3, s_len, bs)?.contiguous()?.matmul(&vb)?; // [nh, A, B, hd]
            let o = (o_ctx + o_blk.reshape((nh, n, hd))?)?
                .transpose(0, 1)?
                .reshape((n, nh * hd))?;
            x = (x + linear(&o, w("self_attn.o_proj"))?)?;
            let xn = rms(&x, w("post_attention_layernorm"), eps)?;
            let g = linear(&xn, w("mlp.gate_proj"))?.silu()?;
            let u = linear(&xn, w("mlp.up_proj"))?;
            x = (x + linear(&(g * u)?, w("mlp.down_proj"))?)?;
        }
        rms(&x, self.w("norm.weight"), eps)
    }
}
