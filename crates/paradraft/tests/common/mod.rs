//! Shared helpers for the integration tests.
#![allow(dead_code)]

use paradraft::model::{self, Batch, Loaded, Logits, OutputSpec, Rows, Scratch};
use paradraft::types::{Pos, TokenId};
use std::path::PathBuf;

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

pub fn load_tiny(name: &str) -> Loaded {
    model::load(&fixtures().join("tiny").join(name)).expect("tiny model loads")
}

/// Reads an f32 or i64 tensor from a reference safetensors file as (shape, f64 values).
pub fn read_ref(path: &PathBuf, name: &str) -> (Vec<usize>, Vec<f64>) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    let vals = match t.dtype() {
        safetensors::Dtype::F32 => t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        safetensors::Dtype::I64 => t
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        d => panic!("unexpected dtype {d:?}"),
    };
    (t.shape().to_vec(), vals)
}

pub fn ids(v: &[f64]) -> Vec<TokenId> {
    v.iter().map(|&x| TokenId(x as u32)).collect()
}

pub fn seq_positions(start: usize, n: usize) -> Vec<Pos> {
    (start..start + n).map(|p| Pos(p as u32)).collect()
}

/// Full logits for every token of `tokens`, run as one causal forward from an empty cache.
pub fn run_logits(lm: &Loaded, tokens: &[TokenId]) -> Vec<Vec<f32>> {
    let mut kv = lm.model.new_kv(tokens.len() + 8);
    let mut s = Scratch::default();
    let pos = seq_positions(0, tokens.len());
    let out = lm
        .model
        .forward(
            &mut kv,
            &Batch {
                tokens,
                positions: &pos,
                mask: None,
            },
            &OutputSpec::all_full(),
            &mut s,
        )
        .unwrap();
    (0..tokens.len())
        .map(|i| out.logits_row(i).to_vec())
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn spec_with_taps(taps: Vec<usize>) -> OutputSpec {
    OutputSpec {
        rows: Rows::All,
        logits: Logits::Full,
        taps,
    }
}
