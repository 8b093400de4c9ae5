//! Pieces of the drafters' differentiable graphs (DFlash's and DART's): seeded initialisation,
//! linear layers, RMSNorm with its backward, composed rotate-half RoPE, GQA expansion.

use candle_core::{Device, Tensor, D};
use rand_chacha::ChaCha8Rng;
use rand_core::RngCore;

pub type CResult<T> = candle_core::Result<T>;

/// The trainable tensors of one LLaMA-style decoder layer whose q/k/v projections read
/// `in_width` floats, as `(name, shape)` with names from `name` (`"self_attn.q_proj"` → the
/// tensor's full name), q/k norms when `qk_norm`. The matrices come in one order (q, k, v, o,
/// gate, up, down), which is the order [`init_vars`] draws their seeded values in.
pub fn layer_shapes(
    c: &crate::model::Config,
    in_width: usize,
    qk_norm: bool,
    name: impl Fn(&str) -> String,
) -> Vec<(String, Vec<usize>)> {
    let (h, hd, ff) = (c.hidden_size, c.head_dim, c.intermediate_size);
    let (qd, kvd) = (c.n_heads * hd, c.n_kv_heads * hd);
    let mut v = vec![
        (name("input_layernorm"), vec![h]),
        (name("post_attention_layernorm"), vec![h]),
        (name("self_attn.q_proj"), vec![qd, in_width]),
        (name("self_attn.k_proj"), vec![kvd, in_width]),
        (name("self_attn.v_proj"), vec![kvd, in_width]),
        (name("self_attn.o_proj"), vec![h, qd]),
    ];
    if qk_norm {
        v.push((name("self_attn.q_norm"), vec![hd]));
        v.push((name("self_attn.k_norm"), vec![hd]));
    }
    v.extend([
        (name("mlp.gate_proj"), vec![ff, h]),
        (name("mlp.up_proj"), vec![ff, h]),
        (name("mlp.down_proj"), vec![h, ff]),
    ]);
    v
}

/// Standard-normal samples times `std` from a seeded stream (Box–Muller).
pub fn normals(rng: &mut ChaCha8Rng, n: usize, std: f32) -> Vec<f32> {
    let u = |r: &mut ChaCha8Rng| ((r.next_u32() >> 8) as f32 + 0.5) / (1u32 << 24) as f32;
    (0..n)
        .map(|_| {
            let (a, b) = (u(rng), u(rng));
            std * (-2.0 * a.ln()).sqrt() * (std::f32::consts::TAU * b).cos()
        })
        .collect()
}

/// `x Wᵀ` (no bias), over `x`'s last dimension; with bf16 products on the CPU when
/// [`crate::train::bf16::set_matmul_precision`] asked for them and the CPU has AVX-512 BF16.
pub fn linear(x: &Tensor, w: &Tensor) -> CResult<Tensor> {
    if !(x.device().is_cpu() && crate::train::bf16::active()) {
        return x.matmul(&w.t()?);
    }
    let dims = x.dims().to_vec();
    let k = *dims.last().unwrap_or(&0);
    let rows = x.elem_count() / k.max(1);
    let y = crate::train::bf16::linear(&x.reshape((rows, k))?, w)?;
    let mut out = dims;
    if let Some(last) = out.last_mut() {
        *last = w.dim(0)?;
    }
    y.reshape(out)
}

/// RMSNorm over the last dimension, with its backward (`train::fused`).
pub fn rms(x: &Tensor, w: &Tensor, eps: f64) -> CResult<Tensor> {
    crate::train::fused::rms_norm(x, w, eps)
}

/// Rotate-half RoPE on `[n, heads, hd]` with `cos`, `sin` of shape `[n, 1, hd/2]`.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> CResult<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let a = (x1.broadcast_mul(cos)? - x2.broadcast_mul(sin)?)?;
    let b = (x1.broadcast_mul(sin)? + x2.broadcast_mul(cos)?)?;
    Tensor::cat(&[a, b], D::Minus1)
}

/// The RoPE tables of `pos` for inverse frequencies `inv_freq`: `(cos, sin)`, each
/// `[positions, 1, hd/2]`, on `dev`.
pub fn cos_sin(inv_freq: &[f32], pos: &[u32], dev: &Device) -> CResult<(Tensor, Tensor)> {
    let half = inv_freq.len();
    let (mut c, mut s) = (Vec::with_capacity(pos.len() * half), Vec::new());
    s.reserve(pos.len() * half);
    for &p in pos {
        for &f in inv_freq {
            let a = p as f32 * f;
            c.push(a.cos());
            s.push(a.sin());
        }
    }
    let shape = (pos.len(), 1, half);
    Ok((
        Tensor::from_vec(c, shape, dev)?,
        Tensor::from_vec(s, shape, dev)?,
    ))
}

/// `[n, kv_heads, hd]` → `[n, heads, hd]` (each KV head serves `groups` query heads).
pub fn expand_kv(x: &Tensor, groups: usize) -> CResult<Tensor> {
    if groups == 1 {
        return Ok(x.clone());
    }
    let (n, kvh, hd) = x.dims3()?;
    x.unsqueeze(2)?
        .broadcast_as((n, kvh, groups, hd))?
        .reshape((n, kvh * groups, hd))
}

/// Fresh weights for `shapes`, seeded: `special(name, n, rng)` may give a tensor's values;
/// otherwise matrices N(0, 0.02²) and vectors (norms) 1, the HF initialisation.
pub fn init_vars(
    shapes: Vec<(String, Vec<usize>)>,
    seed: u64,
    mut special: impl FnMut(&str, usize, &mut ChaCha8Rng) -> Option<Vec<f32>>,
) -> CResult<crate::train::run::Vars> {
    use rand_core::SeedableRng;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut vars = std::collections::BTreeMap::new();
    for (name, shape) in shapes {
        let n: usize = shape.iter().product();
        let v = match special(&name, n, &mut rng) {
            Some(v) => v,
            None if shape.len() == 1 => vec![1f32; n],
            None => normals(&mut rng, n, 0.02),
        };
        vars.insert(name, candle_core::Var::from_vec(v, shape, &Device::Cpu)?);
    }
    Ok(vars)
}

/// Trainable weights by name from `t` (a checkpoint or an exported drafter) with the `shapes`
/// a network expects; every one must be present with its shape.
pub fn vars_from(
    shapes: Vec<(String, Vec<usize>)>,
    t: &std::collections::HashMap<String, Tensor>,
) -> CResult<crate::train::run::Vars> {
    let mut vars = std::collections::BTreeMap::new();
    for (name, shape) in shapes {
        let x = t
            .get(&name)
            .ok_or_else(|| candle_core::Error::Msg(format!("checkpoint lacks {name}")))?
            .to_dtype(candle_core::DType::F32)?;
        if x.dims() != shape.as_slice() {
            candle_core::bail!("{name} has shape {:?}, expected {shape:?}", x.dims());
        }
        vars.insert(name, candle_core::Var::from_tensor(&x)?);
    }
    Ok(vars)
}

/// The same weights moved to `dev`.
pub fn vars_to(vars: crate::train::run::Vars, dev: &Device) -> CResult<crate::train::run::Vars> {
    vars.into_iter()
        .map(|(k, v)| {
            Ok((
                k,
                candle_core::Var::from_tensor(&v.as_tensor().to_device(dev)?)?,
            ))
        })
        .collect()
}
