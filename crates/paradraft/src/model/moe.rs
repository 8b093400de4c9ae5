//! Mixture-of-experts MLPs (Mixtral, Qwen3-MoE, Qwen2-MoE): a router scores every expert per
//! token, the `n_used` most probable SwiGLU experts run on that token, and their outputs are
//! summed, weighted by the router's softmax probabilities (renormalised over the chosen experts
//! when the model says so: Mixtral always, Qwen3-MoE by `norm_topk_prob`, llama.cpp for both;
//! Qwen2-MoE never in llama.cpp). Qwen2-MoE adds a shared expert every token runs, its output
//! scaled by a sigmoid gate of the token (`ffn_*_shexp`, `ffn_gate_inp_shexp`).
//!
//! Expert weights come stacked, as llama.cpp writes them (`blk.N.ffn_gate_exps.weight`,
//! `[experts, rows, cols]`; each expert is a contiguous run of whole rows, so it is used in
//! place whatever its type), or one matrix per expert as HF checkpoints store them
//! (`blk.N.ffn_gate_exps.E.weight`, which the safetensors source maps to Qwen3-MoE's or
//! Mixtral's names).
//!
//! Batch invariance: a row's experts, their weights and the order their outputs are added (by
//! expert index) depend on that row alone, and the matrix kernels compute each row of a product
//! independently of the others, so a token's output is the same in any batch or tree.

use super::config::{Activation, Config, Moe, SharedExpert};
use super::source::TensorSource;
use crate::error::{Error, Result};
use crate::runtime::ops;
use crate::runtime::qmatmul::QActs;
use crate::runtime::quant::{dot, par_rows, prep_acts as prep, sized, Matrix};

/// One layer's experts and router.
pub(crate) struct Experts {
    pub(crate) moe: Moe,
    /// `[experts, hidden]`.
    router: Matrix,
    gate: Vec<Matrix>,
    up: Vec<Matrix>,
    down: Vec<Matrix>,
    shared: Option<Shared>,
}

/// The shared expert's gate, up and down matrices and its gate vector.
struct Shared {
    mats: [Matrix; 3],
    gate: Vec<f32>,
}

/// Buffers of an MoE forward, reused.
#[derive(Default)]
pub(crate) struct MoeScratch {
    logits: Vec<f32>,
    /// Per expert: the rows routed to it and their weights.
    routed: Vec<Vec<(usize, f32)>>,
    xe: Vec<f32>,
    ye: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

impl Experts {
    /// Layer weights named by `name` (`"ffn_gate_inp.weight"` → its full name).
    pub(crate) fn load(
        src: &dyn TensorSource,
        c: &Config,
        moe: &Moe,
        name: impl Fn(&str) -> String,
    ) -> Result<Experts> {
        let (h, ff, e) = (c.hidden_size, moe.ff, moe.n_experts);
        Ok(Experts {
            moe: moe.clone(),
            router: src.matrix(&name("ffn_gate_inp.weight"), e, h)?,
            gate: stacked(src, &name("ffn_gate_exps"), e, ff, h)?,
            up: stacked(src, &name("ffn_up_exps"), e, ff, h)?,
            down: stacked(src, &name("ffn_down_exps"), e, h, ff)?,
            shared: moe
                .shared
                .map(|s| Shared::load(src, h, s, &name))
                .transpose()?,
        })
    }

    /// Every expert matrix (to convert their storage); the router stays as stored (llama.cpp
    /// keeps it f32 too: it decides which experts run).
    pub(crate) fn matrices_mut(&mut self) -> Vec<&mut Matrix> {
        let mut v: Vec<&mut Matrix> = vec![];
        v.extend(self.gate.iter_mut());
        v.extend(self.up.iter_mut());
        v.extend(self.down.iter_mut());
        if let Some(s) = &mut self.shared {
            v.extend(s.mats.iter_mut());
        }
        v
    }

    /// Bytes one token streams on average: the router and `n_used` of the experts.
    pub(crate) fn token_bytes(&self) -> usize {
        let experts: usize = (self.gate.iter().chain(&self.up).chain(&self.down))
            .map(|m| m.nbytes())
            .sum();
        let shared: usize = (self.shared.iter().flat_map(|s| &s.mats))
            .map(|m| m.nbytes())
            .sum();
        self.router.nbytes() + shared + experts * self.moe.n_used / self.moe.n_experts
    }

    /// The MLP of the rows `xn` (`n × hidden`, already normed) into `out` (`n × hidden`).
    pub(crate) fn forward(
        &self,
        act: Activation,
        xn: &[f32],
        out: &mut [f32],
        qa: &mut QActs,
        s: &mut MoeScratch,
        exact: bool,
    ) {
        let (h, e) = (self.router.cols, self.moe.n_experts);
        let n = xn.len() / h;
        let logits = sized(&mut s.logits, n * e);
        prep(qa, &[&self.router], xn, exact);
        self.router.matmul(xn, qa, logits);
        s.routed.resize_with(e, Vec::new);
        s.routed.iter_mut().for_each(Vec::clear);
        for (r, row) in logits.chunks_exact(e).enumerate() {
            for (x, w) in route(row, self.moe.n_used, self.moe.norm_topk) {
                s.routed[x].push((r, w));
            }
        }
        out.fill(0.0);
        for x in 0..e {
            let rows = &s.routed[x];
            if rows.is_empty() {
                continue;
            }
            let xe = sized(&mut s.xe, rows.len() * h);
            for (j, &(r, _)) in rows.iter().enumerate() {
                xe[j * h..(j + 1) * h].copy_from_slice(&xn[r * h..(r + 1) * h]);
            }
            let ye = sized(&mut s.ye, rows.len() * h);
            let mats = (&self.gate[x], &self.up[x], &self.down[x]);
            glu(act, mats, xe, qa, (&mut s.gate, &mut s.up), ye, exact);
            for (j, &(r, w)) in rows.iter().enumerate() {
                let o = &mut out[r * h..(r + 1) * h];
                for (o, y) in o.iter_mut().zip(&ye[j * h..(j + 1) * h]) {
                    *o += w * y;
                }
            }
        }
        if let Some(sh) = &self.shared {
            let ye = sized(&mut s.ye, n * h);
            let [g, u, d] = &sh.mats;
            glu(act, (g, u, d), xn, qa, (&mut s.gate, &mut s.up), ye, exact);
            for ((o, y), x) in out
                .chunks_exact_mut(h)
                .zip(ye.chunks_exact(h))
                .zip(xn.chunks_exact(h))
            {
                let w = sigmoid(dot(&sh.gate, x));
                for (o, y) in o.iter_mut().zip(y) {
                    *o += w * y;
                }
            }
        }
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl Shared {
    fn load(
        src: &dyn TensorSource,
        h: usize,
        s: SharedExpert,
        name: &impl Fn(&str) -> String,
    ) -> Result<Shared> {
        // One value per token: llama.cpp's files hold it as `[hidden]`, HF's as `[1, hidden]`.
        let n = name("ffn_gate_inp_shexp.weight");
        let shape = src.shape(&n).ok_or_else(|| src.missing(&n))?;
        let shape = if shape == [1, h] { shape } else { vec![h] };
        let gate = src.f32_tensor(&n, &shape)?;
        Ok(Shared {
            mats: [
                src.matrix(&name("ffn_gate_shexp.weight"), s.ff, h)?,
                src.matrix(&name("ffn_up_shexp.weight"), s.ff, h)?,
                src.matrix(&name("ffn_down_shexp.weight"), h, s.ff)?,
            ],
            gate,
        })
    }
}

/// The experts a token uses and their weights, from its router logits: the `k` most probable
/// under the softmax (ties to the lower index), weighted by their probabilities, renormalised to
/// sum to 1 when `norm`; in expert order.
pub(crate) fn route(logits: &[f32], k: usize, norm: bool) -> Vec<(usize, f32)> {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut p: Vec<f32> = logits.iter().map(|&x| (x - m).exp()).collect();
    let z: f32 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= z);
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    let mut chosen: Vec<(usize, f32)> =
        order[..k.min(p.len())].iter().map(|&x| (x, p[x])).collect();
    if norm {
        let sum: f32 = chosen.iter().map(|c| c.1).sum();
        chosen.iter_mut().for_each(|c| c.1 /= sum);
    }
    chosen.sort_by_key(|c| c.0);
    chosen
}

/// A gated MLP `down(act(gate · x) ⊙ (up · x))` of the rows `x` into `out`; `bufs` hold the
/// gate and up products.
pub(crate) fn glu(
    act: Activation,
    (gate_m, up_m, down_m): (&Matrix, &Matrix, &Matrix),
    x: &[f32],
    qa: &mut QActs,
    bufs: (&mut Vec<f32>, &mut Vec<f32>),
    out: &mut [f32],
    exact: bool,
) {
    let (n, ff) = (x.len() / gate_m.cols, gate_m.rows);
    let gate = sized(bufs.0, n * ff);
    let up = sized(bufs.1, n * ff);
    prep(qa, &[gate_m, up_m], x, exact);
    Matrix::matmul_many(&mut [(gate_m, &mut *gate), (up_m, &mut *up)], x, qa);
    let up = &*up;
    par_rows(gate, ff, |r, g| {
        let u = &up[r.start * ff..r.end * ff];
        match act {
            Activation::Silu => ops::silu_mul(g, u),
            Activation::GeluTanh => ops::gelu_tanh_mul(g, u),
        }
    });
    prep(qa, &[down_m], gate, exact);
    down_m.matmul(gate, qa, out);
}

/// The `experts` matrices of `rows × cols` named `base`: slices of the stacked
/// `base.weight` (`[experts, rows, cols]`) when the source has it, else `base.E.weight` each.
fn stacked(
    src: &dyn TensorSource,
    base: &str,
    experts: usize,
    rows: usize,
    cols: usize,
) -> Result<Vec<Matrix>> {
    let name = format!("{base}.weight");
    let Some(shape) = src.shape(&name) else {
        return (0..experts)
            .map(|x| src.matrix(&format!("{base}.{x}.weight"), rows, cols))
            .collect();
    };
    let bad = |reason: String| Error::BadModelFile {
        path: src.describe().into(),
        format: "model",
        reason,
    };
    if shape != [experts, rows, cols] {
        return Err(bad(format!(
            "tensor {name} has shape {shape:?}, expected {:?}",
            [experts, rows, cols]
        )));
    }
    let (ty, bytes) = src.raw(&name).ok_or_else(|| src.missing(&name))?;
    let per = rows * ty.row_bytes(cols);
    if bytes.len() != per * experts {
        return Err(bad(format!(
            "tensor {name} holds {} bytes, expected {}",
            bytes.len(),
            per * experts
        )));
    }
    Ok(bytes
        .chunks_exact(per)
        .map(|b| Matrix::from_bytes(ty, rows, cols, b))
        .collect())
}

/// The MoE settings of a GGUF file of architecture `arch` (`None`: dense). llama.cpp
/// renormalises the chosen experts' weights for Mixtral (`llama`) and `qwen3moe`, not for
/// `qwen2moe`.
pub(crate) fn gguf_moe(g: &super::gguf::GgufFile, arch: &str) -> Result<Option<Moe>> {
    let key = |k: &str| format!("{arch}.{k}");
    let n_experts = g.u64(&key("expert_count")).unwrap_or(0) as usize;
    if n_experts == 0 {
        if g.has("blk.0.ffn_gate_inp.weight") {
            return Err(Error::Unsupported(format!(
                "mixture of experts: a {arch} file with expert tensors (ffn_gate_inp) but no \
                 {arch}.expert_count"
            )));
        }
        return Ok(None);
    }
    let qwen2 = arch == "qwen2moe";
    let shared = g.has("blk.0.ffn_gate_shexp.weight") || g.has("blk.0.ffn_up_shexp.weight");
    if shared != qwen2 {
        return Err(Error::Unsupported(format!(
            "a {arch} file {} shared experts (supported: Qwen2-MoE's gated shared expert)",
            if shared { "with" } else { "without" }
        )));
    }
    let n_used = g.req_u64(&key("expert_used_count"))? as usize;
    // Without its own key, llama.cpp takes Mixtral's expert width as the MLP's and a Qwen MoE
    // file's as the MLP's over the experts a token uses.
    let mlp = || g.req_u64(&key("feed_forward_length")).map(|v| v as usize);
    let ff = match g.u64(&key("expert_feed_forward_length")) {
        Some(ff) => ff as usize,
        None if arch == "llama" => mlp()?,
        None => mlp()? / n_used.max(1),
    };
    let shared = match qwen2 {
        true => Some(SharedExpert {
            ff: match g.u64(&key("expert_shared_feed_forward_length")) {
                Some(ff) => ff as usize,
                None => mlp()?,
            },
        }),
        false => None,
    };
    Ok(Some(Moe {
        n_experts,
        n_used,
        ff,
        norm_topk: !qwen2,
        shared,
    }))
}

/// The MoE settings of an HF config of `model_type` `mixtral`, `qwen3_moe` or `qwen2_moe`
/// (`None`: others).
pub(crate) fn hf_moe(v: &serde_json::Value, model_type: &str) -> Result<Option<Moe>> {
    let num = |k: &str| v[k].as_u64().map(|x| x as usize);
    let (ff, norm_topk) = match model_type {
        "mixtral" => (num("intermediate_size"), true),
        "qwen3_moe" | "qwen2_moe" => {
            if num("decoder_sparse_step").unwrap_or(1) != 1
                || v["mlp_only_layers"]
                    .as_array()
                    .is_some_and(|a| !a.is_empty())
            {
                return Err(Error::Unsupported(format!(
                    "{model_type} with dense layers (decoder_sparse_step ≠ 1 or mlp_only_layers)"
                )));
            }
            let norm = v["norm_topk_prob"].as_bool().unwrap_or(false);
            (num("moe_intermediate_size"), norm)
        }
        _ => return Ok(None),
    };
    let missing = |k: &str| Error::BadModelFile {
        path: "config.json".into(),
        format: "config.json",
        reason: format!("missing integer {k}"),
    };
    Ok(Some(Moe {
        n_experts: num("num_local_experts")
            .or(num("num_experts"))
            .ok_or_else(|| missing("num_local_experts"))?,
        n_used: num("num_experts_per_tok").ok_or_else(|| missing("num_experts_per_tok"))?,
        ff: ff.ok_or_else(|| missing("moe_intermediate_size"))?,
        norm_topk,
        shared: match model_type {
            "qwen2_moe" => Some(SharedExpert {
                ff: num("shared_expert_intermediate_size")
                    .ok_or_else(|| missing("shared_expert_intermediate_size"))?,
            }),
            _ => None,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The router keeps the k most probable experts, in expert order, weighted by their softmax
    /// probabilities (renormalised when asked); ties go to the lower index.
    #[test]
    fn routing_picks_the_top_k_by_probability() {
        let logits = [0.5f32, 2.0, -1.0, 2.0, 1.0];
        let z: f32 = logits.iter().map(|x| x.exp()).sum();
        let got = route(&logits, 2, false);
        assert_eq!(got.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 3]);
        assert!((got[0].1 - 2f32.exp() / z).abs() < 1e-6);
        let got = route(&logits, 3, true);
        assert_eq!(got.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 3, 4]);
        let sum = 2.0 * 2f32.exp() + 1f32.exp();
        assert!((got[2].1 - 1f32.exp() / sum).abs() < 1e-6);
        assert!((got.iter().map(|c| c.1).sum::<f32>() - 1.0).abs() < 1e-6);
        // Equal logits: the lower indices win.
        let got = route(&[1.0; 4], 2, true);
        assert_eq!(got, vec![(0, 0.5), (1, 0.5)]);
    }
}
