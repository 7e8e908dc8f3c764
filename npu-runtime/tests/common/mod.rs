//! Shared by the integration tests that load real models (`npu_runtime::test_support`).
#![allow(unused_imports)]

pub use npu_runtime::test_support::{
    h, logit_bits, model_file, model_or_skip, rand_vec, smollm2, xorshift,
};
