//! CPU compute kernels: quantized matrix-vector/matrix products with run-time
//! ISA dispatch (AVX-512 VNNI, AVX2, portable), a persistent thread pool, and
//! f32 vector helpers.
//!
//! Every kernel is batch-invariant: the result for one token is bit-identical
//! whatever the batch size, the token's position in the batch, the thread count
//! and the ISA. This makes speculative verification exactly lossless.

mod act;
pub mod attn_tiles;
pub mod gemm_f32;
mod ggml;
pub mod kv_elem;
mod layout;
pub mod matmul;
pub mod peak;
pub mod pool;
mod portable;
pub mod screen;
pub mod silu;
pub mod simd;
pub mod vector;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;

pub use ggml::{kernel_supported, GgmlType};
pub use layout::layout_fingerprint;
pub use matmul::{matmul, matmul_reference, matmul_with_isa, MatmulScratch, QMatrix};
pub use pool::ThreadPool;
pub use simd::{detected, Isa};
pub use vector::{axpy, dot_f32, dot_f32_with_isa, softmax_inplace};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    #[error("{ty:?}: {cols} columns is not a multiple of the block size {block}")]
    NotBlockMultiple {
        ty: GgmlType,
        cols: usize,
        block: usize,
    },
    #[error("{ty:?} {rows}x{cols}: got {got} bytes, expected {expected}")]
    SizeMismatch {
        ty: GgmlType,
        rows: usize,
        cols: usize,
        got: usize,
        expected: usize,
    },
    #[error("{ty:?} is not supported by the CPU kernels")]
    UnsupportedType { ty: GgmlType },
    #[error("matrix shape {rows}x{cols} is empty or too large")]
    BadShape { rows: usize, cols: usize },
}
