//! npu-runtime
