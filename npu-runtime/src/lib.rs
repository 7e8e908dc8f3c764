//! npu-runtime
pub mod attention;
pub mod bert;
pub mod error;
pub mod kernels;
pub mod kv_cache;
pub mod ops;
pub mod schedule;
