//! The DART checkpoint format (docs/dart.md, the published `fvliang/*-dart` layout): a LLaMA-style
//! `config.json` with `draft_length` (mask slots per call), `draft_vocab_size` and optionally
//! `target_hidden_size`, next to a `model.safetensors` with `fc.weight`, `midlayer.*`,
//! `norm.weight`, `lm_head.weight`, `d2t` (I64 offsets) and `t2d` (BOOL). The embedding is the
//! target's and is not stored. Drafters of `num_hidden_layers` > 1 (ours; the paper's has one)
//! add plain LLaMA layers `layers.{i}.*` (i = 1..) over the first one's output.

use crate::drafters::parts::{drafter_layers, drafter_layers_json};
use crate::error::{Error, Result};
use crate::model::{Arch, Config};
use serde_json::json;
use std::path::Path;

/// The most layers a DART drafter may have (drafting must stay far cheaper than the target).
pub const MAX_LAYERS: usize = 8;

#[derive(Clone, Debug)]
pub struct DartConfig {
    /// The draft layers' dimensions (`vocab_size` = the target's). `n_layers` is 1 in the
    /// paper; more stack plain LLaMA layers (`layers.{i}.*`, i ≥ 1) after the first.
    pub layer: Config,
    /// Mask slots appended per call (`d − 1`; the call yields `draft_length + 1` depths).
    pub draft_length: usize,
    /// Rows of `lm_head` (the reduced draft vocabulary).
    pub draft_vocab_size: usize,
    /// The target's hidden size (the width of each tap).
    pub target_hidden_size: usize,
}

/// DART's taps for an `l`-layer target: the outputs of layers 1, L/2 − 1 and L − 4 (the inputs
/// of layers 2, L/2 and L − 3), in that order (docs/dart.md). Targets of fewer than 6 layers (test
/// models) clamp each index into `0..L`.
pub fn dart_taps(l: usize) -> Result<Vec<usize>> {
    if l == 0 {
        return Err(Error::Unsupported("a target without layers".into()));
    }
    Ok(vec![
        1.min(l - 1),
        (l / 2).saturating_sub(1),
        l.saturating_sub(4),
    ])
}

impl DartConfig {
    pub fn from_json(v: &serde_json::Value, path: &Path) -> Result<Self> {
        let bad = |reason: String| Error::BadModelFile {
            path: path.to_path_buf(),
            format: "DART config.json",
            reason,
        };
        let layer = drafter_layers(v, path, "DART config.json", Arch::Llama, "llama")?;
        if !(1..=MAX_LAYERS).contains(&layer.n_layers) {
            return Err(bad(format!(
                "num_hidden_layers is {}; a DART drafter has 1 to {MAX_LAYERS} layers",
                layer.n_layers
            )));
        }
        let uint = |k: &str| {
            v[k].as_u64()
                .map(|u| u as usize)
                .ok_or_else(|| bad(format!("missing integer {k}")))
        };
        let draft_length = uint("draft_length")?;
        if draft_length == 0 {
            return Err(bad("draft_length must be at least 1".into()));
        }
        let draft_vocab_size = uint("draft_vocab_size")?;
        if draft_vocab_size == 0 || draft_vocab_size > layer.vocab_size {
            return Err(bad(format!(
                "draft_vocab_size {draft_vocab_size} must be in 1..={}",
                layer.vocab_size
            )));
        }
        let target_hidden_size = v["target_hidden_size"]
            .as_u64()
            .map_or(layer.hidden_size, |x| x as usize);
        Ok(DartConfig {
            layer,
            draft_length,
            draft_vocab_size,
            target_hidden_size,
        })
    }

    pub fn load(dir: &Path) -> Result<Self> {
        let (v, p) = crate::model::read_config_json(dir, "DART config.json")?;
        Self::from_json(&v, &p)
    }

    /// The published layout.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = drafter_layers_json(&self.layer, "llama", "LlamaForCausalLMEagle3");
        v["draft_length"] = json!(self.draft_length);
        v["draft_vocab_size"] = json!(self.draft_vocab_size);
        v["target_hidden_size"] = json!(self.target_hidden_size);
        v
    }

    /// Refuses a drafter that does not fit `target`.
    pub fn check_target(&self, target: &Config) -> Result<()> {
        crate::drafters::parts::check_fits("DART", &self.layer, target, || {
            if self.target_hidden_size != target.hidden_size {
                return Err(format!(
                    "trained on taps of width {} but the target's hidden size is {}",
                    self.target_hidden_size, target.hidden_size
                ));
            }
            Ok(())
        })?;
        dart_taps(target.n_layers).map(|_| ())
    }
}
