//! One Llama-family decoder layer (pre-norm attention with optional biases and q/k norm, then a
//! SwiGLU MLP), shared by the target models and by drafters built from the same layers (DFlash).

use super::config::Config;
use super::moe::{glu, Experts, MoeScratch};
use super::source::TensorSource;
use crate::error::Result;
use crate::kv::KvCache;
use crate::runtime::attention::{attention_many, AttnJob, Rule, Window};
use crate::runtime::attention::{AttnShape, Visibility};
use crate::runtime::ops;
use crate::runtime::qmatmul::QActs;
use crate::runtime::quant::{par_rows, prep_acts as prep, sized, Matrix, SendPtr};
use crate::types::Pos;

pub(crate) struct Layer {
    attn_norm: Vec<f32>,
    wq: Matrix,
    wk: Matrix,
    wv: Matrix,
    wo: Matrix,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    ffn: Ffn,
    /// Norms of the attention's and the MLP's outputs (Gemma).
    post_attn_norm: Option<Vec<f32>>,
    post_ffn_norm: Option<Vec<f32>>,
    /// This layer's sliding window, if it slides.
    window: Option<usize>,
    /// Its RoPE table is the sliding layers' own ([`LayerScratch::rope_local`]).
    local_rope: bool,
}

/// A layer's MLP: one gated MLP, or a mixture of experts.
enum Ffn {
    Dense {
        gate: Matrix,
        up: Matrix,
        down: Matrix,
    },
    Moe(Box<Experts>),
}

/// Buffers of a layer forward, grown on demand and reused.
#[derive(Default)]
pub(crate) struct LayerScratch {
    /// The residual stream, `n × hidden`.
    pub(crate) x: Vec<f32>,
    pub(crate) xn: Vec<f32>,
    q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// `(cos, sin)` per new token and frequency (see [`rope_table`]).
    pub(crate) rope: Vec<(f32, f32)>,
    /// The same for sliding-window layers with their own RoPE base (Gemma 3).
    pub(crate) rope_local: Vec<(f32, f32)>,
    pub(crate) qa: QActs,
    moe: MoeScratch,
}

impl LayerScratch {
    /// Keeps only the rows of `keep` (ascending, disjoint ranges), in order, of the residual
    /// stream and of the pending attention output (rows are independent after attention: DART
    /// runs its MLP on each sequence's last rows).
    pub(crate) fn keep_rows(&mut self, keep: &[std::ops::Range<usize>], h: usize) {
        for v in [&mut self.x, &mut self.proj] {
            let mut to = 0;
            for r in keep {
                v.copy_within(r.start * h..r.end * h, to);
                to += r.len() * h;
            }
            v.truncate(to);
        }
    }
}

/// A weight in f32: (HF name, shape, values).
pub type NamedWeight = (&'static str, Vec<usize>, Vec<f32>);

/// One sequence's share of a (possibly multi-sequence) layer forward: its KV cache, the slot
/// its new K/V go to, its attention shape and the visibility among its new tokens.
pub(crate) struct SeqAttn<'a> {
    pub(crate) kv: &'a mut KvCache,
    pub(crate) slot0: usize,
    pub(crate) shape: AttnShape,
    pub(crate) vis: Visibility<'a>,
    /// The new tokens' positions (what a sliding window measures from).
    pub(crate) positions: &'a [Pos],
}

/// The RoPE table of `positions`: `(cos, sin)` of position × frequency, token-major.
pub(crate) fn rope_table(inv_freq: &[f32], positions: &[Pos], out: &mut Vec<(f32, f32)>) {
    out.clear();
    rope_rows(inv_freq, positions, 1.0, out);
}

/// Appends the RoPE table of `positions` to `out`, cos and sin multiplied by `scale`.
pub(crate) fn rope_rows(
    inv_freq: &[f32],
    positions: &[Pos],
    scale: f32,
    out: &mut Vec<(f32, f32)>,
) {
    for p in positions {
        for &f in inv_freq {
            let a = p.0 as f32 * f;
            out.push((a.cos() * scale, a.sin() * scale));
        }
    }
}

impl Layer {
    /// Loads layer weights named by `name` from their GGUF-style suffix (`"attn_q.weight"`);
    /// q/k norms when `qk_norm`.
    pub(crate) fn load(
        src: &dyn TensorSource,
        c: &Config,
        qk_norm: bool,
        name: impl Fn(&str) -> String,
    ) -> Result<Layer> {
        Self::load_wide(src, c, qk_norm, c.hidden_size, name)
    }

    /// As [`Layer::load`], with q/k/v projections over inputs of `in_width` floats (EAGLE-3 /
    /// DART layers attend over `[embedding ; fused features]`, twice the hidden size).
    pub(crate) fn load_wide(
        src: &dyn TensorSource,
        c: &Config,
        qk_norm: bool,
        in_width: usize,
        name: impl Fn(&str) -> String,
    ) -> Result<Layer> {
        let (h, hd, ff) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (qd, kvd) = (c.n_heads * hd, c.n_kv_heads * hd);
        let n = |s: &str| name(s);
        let plus = |v| c.extras.norm_weights(v);
        let norm = |s: &str| -> Result<Option<Vec<f32>>> {
            qk_norm.then(|| src.vector(&n(s), hd).map(plus)).transpose()
        };
        let post = |s: &str| -> Result<Option<Vec<f32>>> {
            c.extras
                .post_norms
                .then(|| src.vector(&n(s), h).map(plus))
                .transpose()
        };
        Ok(Layer {
            attn_norm: plus(src.vector(&n("attn_norm.weight"), h)?),
            wq: src.matrix(&n("attn_q.weight"), qd, in_width)?,
            wk: src.matrix(&n("attn_k.weight"), kvd, in_width)?,
            wv: src.matrix(&n("attn_v.weight"), kvd, in_width)?,
            wo: src.matrix(&n("attn_output.weight"), h, qd)?,
            bq: src.opt_vector(&n("attn_q.bias"), qd)?,
            bk: src.opt_vector(&n("attn_k.bias"), kvd)?,
            bv: src.opt_vector(&n("attn_v.bias"), kvd)?,
            q_norm: norm("attn_q_norm.weight")?,
            k_norm: norm("attn_k_norm.weight")?,
            ffn_norm: plus(src.vector(&n("ffn_norm.weight"), h)?),
            ffn: match &c.extras.moe {
                Some(m) => Ffn::Moe(Box::new(Experts::load(src, c, m, n)?)),
                None => Ffn::Dense {
                    gate: src.matrix(&n("ffn_gate.weight"), ff, h)?,
                    up: src.matrix(&n("ffn_up.weight"), ff, h)?,
                    down: src.matrix(&n("ffn_down.weight"), h, ff)?,
                },
            },
            post_attn_norm: post("post_attention_norm.weight")?,
            post_ffn_norm: post("post_ffw_norm.weight")?,
            window: None,
            local_rope: false,
        })
    }

    /// Makes this layer layer `li` of a model whose config may give it a sliding window (and
    /// the sliding layers' own RoPE table).
    pub(crate) fn place(&mut self, c: &Config, li: usize) {
        let w = c.extras.sliding_window.as_ref();
        self.window = w.filter(|w| w.layers[li]).map(|w| w.size);
        self.local_rope = self.window.is_some() && w.is_some_and(|w| w.rope_theta.is_some());
    }

    /// The layer's weights in f32 under their HF / DFlash names (`self_attn.q_proj`, …,
    /// `input_layernorm`), as `(name, shape, values)`, with q/k rows in rotate-half order
    /// (GGUF Llama rows, permuted for interleaved RoPE, are put back). Biases are left out.
    pub(crate) fn weights_f32(&self, c: &Config) -> Vec<NamedWeight> {
        let dense = |m: &Matrix, unpermute: bool| {
            let mut v = vec![0f32; m.rows * m.cols];
            let hd = c.head_dim;
            for r in 0..m.rows {
                // Interleaved row 2i (2i + 1) of a head is rotate-half row i (hd/2 + i).
                let src = if unpermute && c.rope_style == ops::RopeStyle::Interleaved {
                    let (head, j) = (r / hd, r % hd);
                    let i = if j < hd / 2 {
                        2 * j
                    } else {
                        2 * (j - hd / 2) + 1
                    };
                    head * hd + i
                } else {
                    r
                };
                m.row_into(src, &mut v[r * m.cols..(r + 1) * m.cols]);
            }
            (vec![m.rows, m.cols], v)
        };
        let mut out = vec![];
        let mut mats = vec![
            ("self_attn.q_proj", &self.wq, true),
            ("self_attn.k_proj", &self.wk, true),
            ("self_attn.v_proj", &self.wv, false),
            ("self_attn.o_proj", &self.wo, false),
        ];
        // A mixture of experts has no dense MLP to give (drafters are not made of its layers).
        if let Ffn::Dense { gate, up, down } = &self.ffn {
            mats.extend([
                ("mlp.gate_proj", gate, false),
                ("mlp.up_proj", up, false),
                ("mlp.down_proj", down, false),
            ]);
        }
        for (name, m, unpermute) in mats {
            let (shape, v) = dense(m, unpermute);
            out.push((name, shape, v));
        }
        for (name, v) in [
            ("input_layernorm", Some(&self.attn_norm)),
            ("post_attention_layernorm", Some(&self.ffn_norm)),
            ("self_attn.q_norm", self.q_norm.as_ref()),
            ("self_attn.k_norm", self.k_norm.as_ref()),
        ] {
            if let Some(v) = v {
                out.push((name, vec![v.len()], v.clone()));
            }
        }
        out
    }

    /// Quantizes context rows `cx` (`n × hidden`) once for [`Layer::context_kv`] of every
    /// layer shaped like this one (in `s.qa`).
    pub(crate) fn prep_context(&self, cx: &[f32], s: &mut LayerScratch) {
        prep(&mut s.qa, &[&self.wk, &self.wv], cx, false);
    }

    /// The K/V a drafter injects as context (DFlash §3.2): this layer's own k and v
    /// projections of the rows `cx` (prepared by [`Layer::prep_context`]; no input norm),
    /// k-normed and rotated with `s.rope`, written to layer `li` of `kv` at `slot0..`.
    pub(crate) fn context_kv(
        &self,
        c: &Config,
        li: usize,
        cx: &[f32],
        s: &mut LayerScratch,
        kv: &mut KvCache,
        slot0: usize,
    ) {
        let (hd, kvd) = (c.head_dim, c.n_kv_heads * c.head_dim);
        let n = cx.len() / c.hidden_size.max(1);
        let k = sized(&mut s.k, n * kvd);
        let v = sized(&mut s.v, n * kvd);
        Matrix::matmul_many(&mut [(&self.wk, &mut *k), (&self.wv, &mut *v)], cx, &s.qa);
        if let Some(kn) = &self.k_norm {
            ops::rms_norm_inplace(k, kn, c.rms_eps);
        }
        let half = c.rope_dims() / 2;
        for t in 0..n {
            let cs = &s.rope[t * half..(t + 1) * half];
            ops::rope(&mut k[t * kvd..(t + 1) * kvd], hd, cs, c.rope_style);
        }
        kv.write(li, slot0, k, v);
    }

    /// The attention input norm (`input_layernorm`).
    pub(crate) fn attn_norm(&self) -> &[f32] {
        &self.attn_norm
    }

    /// The weight matrices (to convert their storage).
    pub(crate) fn matrices_mut(&mut self) -> Vec<&mut Matrix> {
        let mut v = vec![&mut self.wq, &mut self.wk, &mut self.wv, &mut self.wo];
        match &mut self.ffn {
            Ffn::Dense { gate, up, down } => v.extend([gate, up, down]),
            Ffn::Moe(x) => v.extend(x.matrices_mut()),
        }
        v
    }

    /// The attention's output projection (a quant mix keeps it wider in `Q2_K` / `Q3_K_M`).
    pub(crate) fn out_proj_mut(&mut self) -> &mut Matrix {
        &mut self.wo
    }

    /// The value projection and a dense MLP's down projection: the matrices a `_M` quant mix
    /// keeps wider in some layers.
    pub(crate) fn v_and_down_mut(&mut self) -> Vec<&mut Matrix> {
        let mut v = vec![&mut self.wv];
        if let Ffn::Dense { down, .. } = &mut self.ffn {
            v.push(down);
        }
        v
    }

    /// Bytes of weight matrices one token's forward streams (a mixture of experts: the router
    /// and, on average, the share of the experts a token uses).
    pub(crate) fn weight_bytes(&self) -> usize {
        let attn: usize = [&self.wq, &self.wk, &self.wv, &self.wo]
            .iter()
            .map(|m| m.nbytes())
            .sum();
        attn + match &self.ffn {
            Ffn::Dense { gate, up, down } => gate.nbytes() + up.nbytes() + down.nbytes(),
            Ffn::Moe(x) => x.token_bytes(),
        }
    }

    /// Runs the rows of `s.x` (whose RoPE table is `s.rope`) through the layer. The rows are
    /// the new tokens of `seqs`, back to back: each sequence's K/V are written to layer `li` of
    /// its own cache at its `slot0..`, and its rows attend over that cache's first
    /// `shape.prefix` slots and, as its `vis` says, each other. Norms, projections and the MLP
    /// run over all rows at once. Attention and MLP are added to `s.x`. `exact` asks for f32
    /// activations in quantized matmuls.
    pub(crate) fn forward(
        &self,
        c: &Config,
        li: usize,
        seqs: &mut [SeqAttn],
        s: &mut LayerScratch,
        exact: bool,
    ) {
        self.attend(c, li, seqs, s, exact, None);
        self.mlp(c, s, exact);
    }

    /// The attention half of [`Layer::forward`]: attention over the rows' input (the input
    /// norm of `s.x`, or `input` — rows of the q/k/v projections' width — when given), left in
    /// `s.proj` for [`Layer::mlp`] to add to the residual stream.
    pub(crate) fn attend(
        &self,
        c: &Config,
        li: usize,
        seqs: &mut [SeqAttn],
        s: &mut LayerScratch,
        exact: bool,
        input: Option<&[f32]>,
    ) {
        let n: usize = seqs.iter().map(|q| q.shape.n_new).sum();
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (qd, kvd) = (c.n_heads * hd, c.n_kv_heads * hd);
        let half = c.rope_dims() / 2;
        let xn: &[f32] = match input {
            Some(u) => u,
            None => {
                let xn = sized(&mut s.xn, n * h);
                let x = &s.x;
                par_rows(xn, h, |r, o| {
                    ops::rms_norm(&x[r.start * h..r.end * h], &self.attn_norm, c.rms_eps, o)
                });
                xn
            }
        };
        let rope = if self.local_rope {
            &s.rope_local
        } else {
            &s.rope
        };
        let q = sized(&mut s.q, n * qd);
        let k = sized(&mut s.k, n * kvd);
        let v = sized(&mut s.v, n * kvd);
        prep(&mut s.qa, &[&self.wq, &self.wk, &self.wv], xn, exact);
        Matrix::matmul_many(
            &mut [
                (&self.wq, &mut *q),
                (&self.wk, &mut *k),
                (&self.wv, &mut *v),
            ],
            xn,
            &s.qa,
        );
        // Per token (split across threads for batches): biases, q/k norm, RoPE.
        let (kp, vp) = (SendPtr(k.as_mut_ptr()), SendPtr(v.as_mut_ptr()));
        par_rows(q, qd, |r, qr| {
            // SAFETY: rows r of k and v belong to this range alone.
            let (kr, vr) = unsafe {
                (
                    std::slice::from_raw_parts_mut(kp.get().add(r.start * kvd), r.len() * kvd),
                    std::slice::from_raw_parts_mut(vp.get().add(r.start * kvd), r.len() * kvd),
                )
            };
            for (buf, bias, dim) in [
                (&mut *qr, &self.bq, qd),
                (&mut *kr, &self.bk, kvd),
                (&mut *vr, &self.bv, kvd),
            ] {
                if let Some(bias) = bias {
                    for row in buf.chunks_exact_mut(dim) {
                        ops::add_inplace(row, bias);
                    }
                }
            }
            if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
                ops::rms_norm_inplace(qr, qn, c.rms_eps);
                ops::rms_norm_inplace(kr, kn, c.rms_eps);
            }
            for (i, t) in r.enumerate() {
                let cs = &rope[t * half..(t + 1) * half];
                ops::rope(&mut qr[i * qd..(i + 1) * qd], hd, cs, c.rope_style);
                ops::rope(&mut kr[i * kvd..(i + 1) * kvd], hd, cs, c.rope_style);
            }
        });
        let attn = sized(&mut s.attn, n * qd);
        let mut r0 = 0;
        for sq in seqs.iter_mut() {
            let r = r0..r0 + sq.shape.n_new;
            r0 = r.end;
            sq.kv.write(
                li,
                sq.slot0,
                &k[r.start * kvd..r.end * kvd],
                &v[r.start * kvd..r.end * kvd],
            );
        }
        // Every sequence's attention in one parallel region.
        let (mut q_rest, mut out_rest) = (&q[..], &mut attn[..]);
        let mut jobs = Vec::with_capacity(seqs.len());
        for sq in seqs.iter() {
            let (qs, qr) = q_rest.split_at(sq.shape.n_new * qd);
            let (os, or) = std::mem::take(&mut out_rest).split_at_mut(sq.shape.n_new * qd);
            (q_rest, out_rest) = (qr, or);
            let window = self.window.map(|size| Window {
                size,
                positions: sq.positions,
            });
            jobs.push(AttnJob {
                q: qs,
                kv: sq.kv.layer(li),
                s: &sq.shape,
                vis: sq.vis,
                rule: Rule {
                    scale: c.extras.attn_scale.unwrap_or(1.0 / (hd as f32).sqrt()),
                    softcap: c.extras.attn_softcap,
                    window,
                },
                out: os,
            });
        }
        attention_many(&mut jobs);
        let proj = sized(&mut s.proj, n * h);
        prep(&mut s.qa, &[&self.wo], attn, exact);
        self.wo.matmul(attn, &s.qa, proj);
        if let Some(pn) = &self.post_attn_norm {
            par_rows(proj, h, |_, o| ops::rms_norm_inplace(o, pn, c.rms_eps));
        }
    }

    /// The MLP half of [`Layer::forward`] over every row of `s.x`: first the pending attention
    /// output `s.proj` is added (fused with the MLP's input norm, one pass per token), then the
    /// MLP's output.
    pub(crate) fn mlp(&self, c: &Config, s: &mut LayerScratch, exact: bool) {
        let h = c.hidden_size;
        let n = s.x.len() / h;
        debug_assert_eq!(s.proj.len(), n * h, "attend's output pending for every row");
        let xn = sized(&mut s.xn, n * h);
        let (xp, proj) = (SendPtr(s.x.as_mut_ptr()), &s.proj[..n * h]);
        par_rows(xn, h, |r, o| {
            // SAFETY: rows r of the residual stream belong to this range alone.
            let xr =
                unsafe { std::slice::from_raw_parts_mut(xp.get().add(r.start * h), r.len() * h) };
            ops::add_inplace(xr, &proj[r.start * h..r.end * h]);
            ops::rms_norm(xr, &self.ffn_norm, c.rms_eps, o)
        });
        let proj = sized(&mut s.proj, n * h);
        let act = c.extras.activation;
        match &self.ffn {
            Ffn::Dense { gate, up, down } => glu(
                act,
                (gate, up, down),
                xn,
                &mut s.qa,
                (&mut s.gate, &mut s.up),
                proj,
                exact,
            ),
            Ffn::Moe(x) => x.forward(act, xn, proj, &mut s.qa, &mut s.moe, exact),
        }
        if let Some(pn) = &self.post_ffn_norm {
            par_rows(proj, h, |_, o| ops::rms_norm_inplace(o, pn, c.rms_eps));
        }
        let proj = &*proj;
        par_rows(&mut s.x, h, |r, xr| {
            ops::add_inplace(xr, &proj[r.start * h..r.end * h])
        });
    }
}
