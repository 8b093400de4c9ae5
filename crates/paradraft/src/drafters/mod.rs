//! Drafters, one module per method. Baseline: prompt lookup ([`pld`]); the tests' replayed
//! trees live with the tests (`tests/common/replay.rs`).

pub mod auto;
pub mod dart;
pub mod dflash;
pub mod diffuspec;
pub mod draft_model;
pub mod mask_lm;
pub mod methods;
pub mod pard;
pub mod parts;
pub mod pld;
pub mod registry;
pub mod speculative_config;
pub mod vocab;

pub use registry::NoDraft;
