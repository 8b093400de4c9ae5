//! Benchmarks: the target's kernel cost curve ([`kernels`]) and the speculative-decoding
//! harness that runs methods side by side on prompt sets ([`harness`], [`report`]).

pub mod datasets;
pub mod harness;
pub mod header;
pub mod kernels;
pub mod ngram;
pub mod prompt_file;
pub mod report;
pub mod suite;

pub use kernels::{run_kernel_bench, KernelBench, KernelBenchParams};
