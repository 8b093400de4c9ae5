//! CPU runtime: tensor storage formats and the kernels the forward pass is built from.
//!
//! Each kernel here is the portable reference implementation; faster variants plug in behind
//! the same functions and are tested against these.

/// Defines a function whose body is compiled twice: for the baseline target and with AVX-512
/// enabled, chosen at run time (the body must be safe, portable Rust that vectorises well).
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn inner($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                use $crate::runtime::isa::{isa, Isa};
                #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
                unsafe fn fast512($($arg: $ty),*) $(-> $ret)? {
                    inner($($arg),*)
                }
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn fast256($($arg: $ty),*) $(-> $ret)? {
                    inner($($arg),*)
                }
                // SAFETY: the CPU has the features each clone is compiled for.
                match isa() {
                    Isa::Avx512Vnni | Isa::Amx => return unsafe { fast512($($arg),*) },
                    Isa::Avx2 | Isa::AvxVnni => return unsafe { fast256($($arg),*) },
                    Isa::Portable | Isa::NeonDot => {}
                }
            }
            inner($($arg),*)
        }
    };
}
pub(crate) use multiversion;

pub mod attention;
pub mod blocks;
pub mod ggml;
pub mod isa;
pub mod kquantize;
pub mod kv;
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
