//! CPU runtime: tensor storage formats and the kernels the forward pass is built from.
//!
//! Each kernel here is the portable reference implementation; faster variants plug in behind
//! the same functions and are tested against these.

pub mod ops;
pub mod pool;
pub mod qmatmul;
pub mod quant;

/// Sets the number of threads for the global pool (call once, before the first forward).
pub fn init_threads(n: usize) {
    pool::init(n);
}

/// Default worker count: the machine's available parallelism.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Threads of the global pool (the caller included).
pub fn current_threads() -> usize {
    pool::threads()
}
