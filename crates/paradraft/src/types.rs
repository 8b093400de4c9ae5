//! Distinct types for the integers that flow through the engine, so a position is never
//! passed where a token id or a cache slot is expected.

use serde::{Deserialize, Serialize};

/// A vocabulary id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TokenId(pub u32);

/// A sequence position as seen by RoPE (a tree node sits at prefix length + depth).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Pos(pub u32);

/// A row of the KV cache. Slots are assigned in append order; after a tree forward the
/// accepted path's slots are gathered back to contiguous slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SlotId(pub u32);

impl TokenId {
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

impl Pos {
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

impl SlotId {
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

pub fn token_ids(ids: &[u32]) -> Vec<TokenId> {
    ids.iter().map(|&t| TokenId(t)).collect()
}

pub fn raw_ids(ids: &[TokenId]) -> Vec<u32> {
    ids.iter().map(|t| t.0).collect()
}

/// One training sequence: prompt (chat template applied) then the target's response (what
/// training reads and a draft vocabulary is counted from).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Index of its prompt in the prompt file.
    pub prompt_index: u32,
    /// Tokens before the response; the loss covers `tokens[prompt_len..]`.
    pub prompt_len: u32,
    pub tokens: Vec<TokenId>,
}
