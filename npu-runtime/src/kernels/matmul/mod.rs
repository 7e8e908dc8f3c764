//! Quantized weight matrices and `out = x · Wᵀ` with run-time ISA dispatch.
//!
//! [`QMatrix`] (`qmatrix`) holds a matrix repacked for the kernels; `product` has the
//! products (one matrix, several sharing an input, fused epilogues, SwiGLU) and `argmax`
//! the argmax-only LM head; both go through `dispatch` (scratch, input quantization, pool
//! split, ISA choice) to the ISA kernels, which receive a `kernel_io::Kernel` and write
//! through a `kernel_io::Output`.

mod argmax;
mod dispatch;
pub(super) mod kernel_io;
mod product;
mod qmatrix;
#[cfg(test)]
mod tests;

pub(crate) use argmax::argmax_in_groups;
pub use argmax::{matmul_argmax, matmul_argmax_with_isa, ARGMAX_MAX_TOKENS};
pub use dispatch::{MatmulScratch, MAX_MULTI};
pub use product::{
    matmul, matmul_epilogue, matmul_multi, matmul_multi_epilogue, matmul_multi_epilogue_with_isa,
    matmul_multi_with_isa, matmul_reference, matmul_swiglu, matmul_swiglu_with_isa,
    matmul_with_isa, Epilogue,
};
pub use qmatrix::QMatrix;
