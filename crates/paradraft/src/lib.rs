//! paradraft: a Rust inference engine for lossless speculative decoding with parallel drafters.
//!
//! This crate holds the engine: model loading (GGUF, HF safetensors), the Llama-family forward
//! shaped for draft verification (explicit positions, tree masks, hidden-state taps), the KV
//! cache, the tokenizer and chat template, the sampler and autoregressive generation.
//!
//! Layers on top of that core are features (all on by default): `server` (the OpenAI server and
//! its serving engine), `train` (drafter training), `bench` (the benchmark suite) and `cli`
//! (clap argument structs). `cargo build -p paradraft --no-default-features` builds the core
//! alone, without axum, tokio, prometheus, candle, plotters or clap.

pub mod batch;
#[cfg(feature = "bench")]
pub mod bench;
pub mod draft;
pub mod drafters;
#[cfg(feature = "server")]
pub mod engine;
pub mod error;
pub mod fetch;
pub mod generate;
pub mod grammar;
pub use runtime::kv;
pub mod model;
pub mod ngram;
pub mod process;
pub mod request;
pub mod runtime;
pub mod sample;
#[cfg(feature = "server")]
pub mod server;
pub mod speculative;
#[cfg(feature = "train")]
pub mod train;
pub mod types;

pub use error::{Error, Result};
pub use types::{Pos, SlotId, TokenId};
