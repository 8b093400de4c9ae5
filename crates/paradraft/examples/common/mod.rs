//! What the timing examples share: the model on two threads, a prompt, and output specs.
#![allow(dead_code)] // each example uses part of it
use paradraft::model::{self, Loaded, Logits, OutputSpec, Rows};
use paradraft::{Pos, TokenId};
use std::path::Path;

/// The model at `path` with the pool at two threads, and a fixed prompt of `n` tokens with
/// its positions.
pub fn setup(path: &Path, n: usize) -> paradraft::Result<(Loaded, Vec<TokenId>, Vec<Pos>)> {
    paradraft::runtime::init_threads(2);
    let lm = model::load(path)?;
    let vocab = lm.model.config.vocab_size;
    let prompt = (0..n)
        .map(|i| TokenId(((i * 7919 + 13) % vocab) as u32))
        .collect();
    let pos = (0..n as u32).map(Pos).collect();
    Ok((lm, prompt, pos))
}

/// Every row's `logits`, no taps.
pub fn rows(logits: Logits) -> OutputSpec {
    OutputSpec {
        rows: Rows::All,
        logits,
        taps: vec![],
    }
}

/// No output layer: a prefill that only fills the cache.
pub fn quiet() -> OutputSpec {
    OutputSpec {
        rows: Rows::Last,
        logits: Logits::None,
        taps: vec![],
    }
}

/// The median of each series (sorted in place), as "a.aa b.bb …" ms.
pub fn medians(series: &mut [Vec<f64>]) -> String {
    series
        .iter_mut()
        .map(|v| {
            v.sort_by(f64::total_cmp);
            format!("{:.2}", v[v.len() / 2])
        })
        .collect::<Vec<_>>()
        .join(" ")
}
