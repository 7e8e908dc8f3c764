//! npu-runtime
pub mod kernels;
pub mod attention;
pub mod error;
pub mod kv_cache;
pub mod ops;
pub mod schedule;
