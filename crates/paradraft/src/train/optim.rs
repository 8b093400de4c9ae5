//! Optimisation pieces shared by drafter training: AdamW with f32 moments that can be
//! checkpointed, a cosine schedule with linear warm-up, and global-norm gradient clipping.

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use std::collections::{BTreeMap, HashMap};

type CResult<T> = candle_core::Result<T>;

/// Learning rate at `step` (0-based) of `total`: linear warm-up over `warmup` steps to `peak`,
/// then cosine decay to 0.
pub fn cosine_lr(step: usize, total: usize, warmup: usize, peak: f64) -> f64 {
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1);
    let t = ((step - warmup) as f64 / span as f64).min(1.0);
    peak * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
}

/// AdamW (decoupled weight decay) over named variables.
pub struct AdamW {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Updates taken so far.
    pub t: usize,
    m: BTreeMap<String, Tensor>,
    v: BTreeMap<String, Tensor>,
}

impl AdamW {
    pub fn new(vars: &BTreeMap<String, Var>, weight_decay: f64) -> CResult<Self> {
        let zeros = |v: &Var| v.as_tensor().zeros_like();
        Ok(AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            t: 0,
            m: vars
                .iter()
                .map(|(k, v)| Ok((k.clone(), zeros(v)?)))
                .collect::<CResult<_>>()?,
            v: vars
                .iter()
                .map(|(k, v)| Ok((k.clone(), zeros(v)?)))
                .collect::<CResult<_>>()?,
        })
    }

    /// Global L2 norm of the gradients of `vars`.
    pub fn grad_norm(vars: &BTreeMap<String, Var>, grads: &GradStore) -> CResult<f64> {
        let mut ss = 0f64;
        for v in vars.values() {
            if let Some(g) = grads.get(v.as_tensor()) {
                ss += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            }
        }
        Ok(ss.sqrt())
    }

    /// One update with learning rate `lr`, gradients scaled by `grad_scale` (clipping).
    pub fn step(
        &mut self,
        vars: &BTreeMap<String, Var>,
        grads: &GradStore,
        lr: f64,
        grad_scale: f64,
    ) -> CResult<()> {
        self.t += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let c1 = 1.0 - b1.powi(self.t as i32);
        let c2 = 1.0 - b2.powi(self.t as i32);
        for (name, var) in vars {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            let g = g.affine(grad_scale, 0.0)?;
            let m = ((&self.m[name] * b1)? + (&g * (1.0 - b1))?)?;
            let v = ((&self.v[name] * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let upd = ((&m / c1)? / ((&v / c2)?.sqrt()? + self.eps)?)?;
            let w = var.as_tensor();
            let decayed = (w * (1.0 - lr * self.weight_decay))?;
            var.set(&(decayed - (upd * lr)?)?)?;
            self.m.insert(name.clone(), m);
            self.v.insert(name.clone(), v);
        }
        Ok(())
    }

    /// Moments as `adam.m.<name>` / `adam.v.<name>` tensors (for a checkpoint).
    pub fn state(&self) -> HashMap<String, Tensor> {
        let mut out = HashMap::new();
        for (k, t) in &self.m {
            out.insert(format!("adam.m.{k}"), t.clone());
        }
        for (k, t) in &self.v {
            out.insert(format!("adam.v.{k}"), t.clone());
        }
        out
    }

    /// Restores moments saved by [`AdamW::state`] (onto each variable's device).
    pub fn load_state(&mut self, t: &HashMap<String, Tensor>, steps: usize) -> CResult<()> {
        for (k, m) in self.m.iter_mut() {
            if let Some(x) = t.get(&format!("adam.m.{k}")) {
                *m = x.to_device(m.device())?;
            }
        }
        for (k, v) in self.v.iter_mut() {
            if let Some(x) = t.get(&format!("adam.v.{k}")) {
                *v = x.to_device(v.device())?;
            }
        }
        self.t = steps;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn schedule_warms_up_then_decays_to_zero() {
        let lr = |s| cosine_lr(s, 100, 4, 6e-4);
        assert!((lr(0) - 1.5e-4).abs() < 1e-12);
        assert!((lr(3) - 6e-4).abs() < 1e-12);
        assert!(lr(50) < lr(10) && lr(10) < lr(4) + 1e-12);
        assert!(lr(100).abs() < 1e-12);
    }

    #[test]
    fn adamw_minimises_a_quadratic() -> CResult<()> {
        let mut vars = BTreeMap::new();
        vars.insert(
            "w".to_string(),
            Var::from_vec(vec![3f32, -2.0], 2, &Device::Cpu)?,
        );
        let mut opt = AdamW::new(&vars, 0.0)?;
        for _ in 0..500 {
            let w = vars["w"].as_tensor();
            let loss = (w - Tensor::new(&[1f32, 0.5], &Device::Cpu)?)?
                .sqr()?
                .sum_all()?;
            let g = loss.backward()?;
            opt.step(&vars, &g, 0.05, 1.0)?;
        }
        let w = vars["w"].as_tensor().to_vec1::<f32>()?;
        assert!(
            (w[0] - 1.0).abs() < 1e-2 && (w[1] - 0.5).abs() < 1e-2,
            "{w:?}"
        );
        Ok(())
    }
}
