//! npu-runtime
pub mod attention;
pub mod bert;
pub mod error;
pub mod kernels;
pub mod kv_cache;
pub mod ops;
pub mod schedule;
pub mod backend;
pub mod model_path;
pub mod session;
pub mod weights;
