//! The forward-pass interface shaped for draft verification: new tokens at explicit positions,
//! an optional ancestor mask among them, and outputs chosen per call (logits rows, fused
//! argmax / top-k, hidden-state taps).

use crate::error::{Error, Result};
use crate::types::{Pos, TokenId};

/// A square boolean mask over the new tokens of one forward: `get(i, j)` says whether token `i`
/// attends to token `j`. The cached prefix is always visible. Each token must see itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeMask {
    n: usize,
    bits: Vec<bool>,
}

impl TreeMask {
    pub fn causal(n: usize) -> Self {
        let bits = (0..n * n).map(|ij| ij % n <= ij / n).collect();
        TreeMask { n, bits }
    }

    /// Ancestor mask of a tree given each node's parent (`None` for a root). Parents must come
    /// before their children.
    pub fn from_parents(parents: &[Option<usize>]) -> Result<Self> {
        let n = parents.len();
        let mut bits = vec![false; n * n];
        for (i, p) in parents.iter().enumerate() {
            bits[i * n + i] = true;
            if let Some(p) = *p {
                if p >= i {
                    return Err(Error::BadRequest(format!(
                        "tree node {i} has parent {p}, which does not precede it"
                    )));
                }
                for j in 0..n {
                    if bits[p * n + j] {
                        bits[i * n + j] = true;
                    }
                }
            }
        }
        Ok(TreeMask { n, bits })
    }

    pub fn from_bits(n: usize, bits: Vec<bool>) -> Result<Self> {
        if bits.len() != n * n {
            return Err(Error::BadRequest(format!(
                "mask has {} entries, expected {n}×{n}",
                bits.len()
            )));
        }
        if (0..n).any(|i| !bits[i * n + i]) {
            return Err(Error::BadRequest("every token must see itself".into()));
        }
        Ok(TreeMask { n, bits })
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Row-major `n × n` bits.
    pub fn bits(&self) -> &[bool] {
        &self.bits
    }

    #[inline]
    pub fn get(&self, i: usize, j: usize) -> bool {
        self.bits[i * self.n + j]
    }
}

/// New tokens for one forward. Without a mask they attend causally to each other.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    pub tokens: &'a [TokenId],
    pub positions: &'a [Pos],
    pub mask: Option<&'a TreeMask>,
}

/// What to compute at the output layer for each selected row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// No output layer at all (prefill of a drafter's context, hidden taps only).
    None,
    /// Full vocabulary rows.
    Full,
    /// Only the argmax (ties to the lowest id).
    Argmax,
    /// The k largest logits, descending.
    TopK(usize),
    /// The argmax exactly as [`Logits::Argmax`] computes it, and the k ids scoring highest as
    /// its screen ranks them (the ids near the top re-scored exactly, the others not):
    /// candidates for drafting (Token Recycling), never for sampling.
    ArgmaxTop(usize),
    /// Full rows as cheap as an argmax: the 4-bit screen's scores as they come (int8
    /// activations, nothing re-scored); an id's exact value comes from
    /// [`crate::model::Model::rescore`]. For greedy rows whose choice is made over a subset of
    /// the vocabulary (a grammar's mask) and re-scored near the top, never for sampling.
    /// Without a screen (a 4-bit output layer, exact mode) the rows of [`Logits::Full`].
    Screened,
}

impl Logits {
    /// Whether every row comes back whole (`rows × vocab` logits).
    pub fn full_rows(self) -> bool {
        matches!(self, Logits::Full | Logits::Screened)
    }
}

/// Which of the new tokens get output-layer results.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rows {
    All,
    Last,
    Some(Vec<usize>),
}

#[derive(Clone, Debug)]
pub struct OutputSpec {
    pub rows: Rows,
    pub logits: Logits,
    /// Decoder layers (0-based) whose outputs are returned, concatenated in this order.
    pub taps: Vec<usize>,
}

impl OutputSpec {
    pub fn last_full() -> Self {
        OutputSpec {
            rows: Rows::Last,
            logits: Logits::Full,
            taps: vec![],
        }
    }
    pub fn all_full() -> Self {
        OutputSpec {
            rows: Rows::All,
            logits: Logits::Full,
            taps: vec![],
        }
    }
}

/// Results of a forward, reused across calls to avoid allocation.
#[derive(Clone, Debug, Default)]
pub struct Output {
    /// Indices (into the batch) of the rows that have output-layer results.
    pub rows: Vec<usize>,
    pub vocab: usize,
    /// `rows.len() × vocab` when `Logits::Full`.
    pub logits: Vec<f32>,
    /// One per row when `Logits::Argmax` or `Logits::ArgmaxTop`.
    pub argmax: Vec<TokenId>,
    /// One list per row when `Logits::TopK` or `Logits::ArgmaxTop`.
    pub top: Vec<Vec<(TokenId, f32)>>,
    /// `n_tokens × (taps.len() · hidden)`: every new token's tapped layer outputs.
    pub hidden: Vec<f32>,
}

impl Output {
    pub fn logits_row(&self, i: usize) -> &[f32] {
        &self.logits[i * self.vocab..(i + 1) * self.vocab]
    }
}
