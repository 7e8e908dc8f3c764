//! npu-runtime
pub mod attention;
pub mod backend;
pub mod error;
pub mod kernels;
pub mod kv_cache;
pub mod model;
pub mod ops;
pub mod schedule;
pub mod session;
#[cfg(test)]
mod test_rng;
#[cfg(feature = "test-support")]
pub mod test_support;
pub mod weights;
pub mod weights_cache;
