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

/// A fixed xorshift stream of values uniform in [-0.5, 0.5) (the kernel examples' data).
pub fn uniform() -> impl FnMut() -> f32 {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

/// A `rows × cols` matrix of `rnd`'s values quantized to the GGML type called `name` (any
/// with a quantiser here, `quant::quantiser`) and packed; exits with status 2 naming an
/// unknown type.
pub fn random_packed(
    name: &str,
    rows: usize,
    cols: usize,
    rnd: &mut impl FnMut() -> f32,
) -> paradraft::runtime::qmatmul::Packed {
    use paradraft::runtime::{ggml::GgmlType, quant};
    let found = GgmlType::ALL
        .into_iter()
        .find(|t| t.name().eq_ignore_ascii_case(name))
        .and_then(|t| quant::quantiser(t, cols));
    let Some((ty, quantize)) = found else {
        eprintln!("unknown type {name}");
        std::process::exit(2);
    };
    let w: Vec<f32> = (0..rows * cols).map(|_| rnd()).collect();
    paradraft::runtime::qmatmul::Packed::new(ty, rows, cols, &quantize(&w))
}
