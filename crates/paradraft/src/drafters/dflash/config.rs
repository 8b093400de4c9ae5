//! The DFlash checkpoint format (docs/dflash.md): an HF-style Qwen3 `config.json` with
//! `block_size`, `num_target_layers` and `dflash_config.{mask_token_id, target_layer_ids}`,
//! next to a `model.safetensors` holding `fc`, `hidden_norm`, `layers.{i}.…` and `norm` (no
//! embedding, no LM head). paradraft adds one optional key, `draft_vocab_size`, with an I64
//! tensor `d2t` (EAGLE-3's convention: draft id `i` is target id `i + d2t[i]`) when the drafter
//! scores a reduced vocabulary.

use crate::drafters::parts::{drafter_layers, drafter_layers_json};
use crate::error::{Error, Result};
use crate::model::{Arch, Config};
use serde_json::json;
use std::path::Path;

#[derive(Clone, Debug)]
pub struct DflashConfig {
    /// The draft layers' dimensions (`n_layers` = draft layers, `vocab_size` = the target's).
    pub layers: Config,
    /// Block size the drafter was trained with (bonus token + B − 1 masks).
    pub block_size: usize,
    /// Decoder layers of the target it was trained for.
    pub num_target_layers: usize,
    /// Target embedding row used for the mask slots (frozen, not learned).
    pub mask_token_id: u32,
    /// Target layers (0-based, their outputs) fused into the context.
    pub target_layer_ids: Vec<usize>,
    /// Size of the reduced draft vocabulary, when the checkpoint has one (`d2t`).
    pub draft_vocab_size: Option<usize>,
}

/// The paper's default taps: `n` target layers spread uniformly from layer 1 to `L − 3`
/// (`[L/2]` for one), rounded half to even as the reference code does.
pub fn default_target_layers(n_target_layers: usize, n: usize) -> Vec<usize> {
    let l = n_target_layers;
    if n <= 1 || l < 5 {
        return vec![l / 2];
    }
    (0..n)
        .map(|i| (1.0 + i as f64 * (l - 4) as f64 / (n - 1) as f64).round_ties_even() as usize)
        .collect()
}

impl DflashConfig {
    pub fn from_json(v: &serde_json::Value, path: &Path) -> Result<Self> {
        let bad = |reason: String| Error::BadModelFile {
            path: path.to_path_buf(),
            format: "DFlash config.json",
            reason,
        };
        let layers = drafter_layers(v, path, "DFlash config.json", Arch::Qwen3, "qwen3")?;
        let uint = |x: &serde_json::Value, k: &str| {
            x.as_u64()
                .map(|u| u as usize)
                .ok_or_else(|| bad(format!("missing integer {k}")))
        };
        let block_size = uint(&v["block_size"], "block_size")?;
        if block_size < 2 {
            return Err(bad(format!("block_size {block_size} must be at least 2")));
        }
        let num_target_layers = uint(&v["num_target_layers"], "num_target_layers")?;
        let dc = &v["dflash_config"];
        let mask_token_id = uint(&dc["mask_token_id"], "dflash_config.mask_token_id")? as u32;
        let target_layer_ids = match dc["target_layer_ids"].as_array() {
            Some(a) => a
                .iter()
                .map(|x| uint(x, "dflash_config.target_layer_ids[]"))
                .collect::<Result<Vec<_>>>()?,
            None => default_target_layers(num_target_layers, layers.n_layers),
        };
        if target_layer_ids.is_empty() {
            return Err(bad("dflash_config.target_layer_ids is empty".into()));
        }
        if dc["causal"].as_bool() == Some(true) || v["is_causal"].as_bool() == Some(true) {
            return Err(Error::Unsupported("causal DFlash drafters".into()));
        }
        let draft_vocab_size = v["draft_vocab_size"].as_u64().map(|x| x as usize);
        Ok(DflashConfig {
            layers,
            block_size,
            num_target_layers,
            mask_token_id,
            target_layer_ids,
            draft_vocab_size,
        })
    }

    pub fn load(dir: &Path) -> Result<Self> {
        let (v, p) = crate::model::read_config_json(dir, "DFlash config.json")?;
        Self::from_json(&v, &p)
    }

    /// The published layout (loadable by the reference code and by us).
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = drafter_layers_json(&self.layers, "qwen3", "DFlashDraftModel");
        v["block_size"] = json!(self.block_size);
        v["num_target_layers"] = json!(self.num_target_layers);
        v["use_sliding_window"] = json!(false);
        v["dflash_config"] = json!({
            "mask_token_id": self.mask_token_id,
            "target_layer_ids": self.target_layer_ids,
        });
        if let Some(n) = self.draft_vocab_size {
            v["draft_vocab_size"] = json!(n);
        }
        v
    }

    /// Refuses a drafter that does not fit `target` (hidden size, vocabulary, tapped layers).
    pub fn check_target(&self, target: &Config) -> Result<()> {
        crate::drafters::parts::check_fits("DFlash", &self.layers, target, || {
            if self.num_target_layers != target.n_layers {
                return Err(format!(
                    "trained for a {}-layer target; this one has {} layers",
                    self.num_target_layers, target.n_layers
                ));
            }
            if let Some(&l) = self
                .target_layer_ids
                .iter()
                .find(|&&l| l >= target.n_layers)
            {
                return Err(format!(
                    "taps layer {l}; the target has {} layers",
                    target.n_layers
                ));
            }
            if self.mask_token_id as usize >= target.vocab_size {
                return Err(format!(
                    "mask token {} is outside the target's vocabulary",
                    self.mask_token_id
                ));
            }
            Ok(())
        })
    }
}
