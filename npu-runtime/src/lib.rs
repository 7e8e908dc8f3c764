//! npu-runtime
pub mod kernels;
