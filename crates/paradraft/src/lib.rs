//! paradraft: a Rust inference engine for lossless speculative decoding with parallel drafters.
//!
//! This crate holds the engine: model loading (GGUF, HF safetensors), the Llama-family forward
//! shaped for draft verification (explicit positions, tree masks, hidden-state taps), the KV
//! cache, the tokenizer and chat template, the sampler and autoregressive generation.

pub mod batch;
pub mod bench;
pub mod drafters;
pub mod engine;
pub mod error;
pub mod fetch;
pub mod generate;
pub mod grammar;
pub mod kv;
pub mod model;
pub mod ngram;
pub mod process;
pub mod request;
pub mod runtime;
pub mod sample;
pub mod server;
pub mod speculative;
pub mod train;
pub mod types;

pub use error::{Error, Result};
pub use types::{Pos, SlotId, TokenId};
