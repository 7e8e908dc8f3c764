//! Small f32 vector helpers with a fixed, documented reduction order, so a
//! value never depends on batch size, thread count or ISA. The attention's weighted
//! sums read V as the KV cache stores it (f32, or half floats widened exactly).
//!
//! `reduce`: dot product and sum of squares; `axpy`: `y += alpha * x` and the weighted
//! sums of V rows; `softmax`: the canonical `exp_neg` and the softmax numerators.

mod axpy;
mod reduce;
mod softmax;
#[cfg(test)]
mod tests;

pub use axpy::{axpy, axpy_rows, axpy_rows_multi_with_isa, axpy_rows_with_isa};
pub use reduce::{dot_f32, dot_f32_with_isa, sum_squares_f64, sum_squares_f64_with_isa};
#[cfg(target_arch = "x86_64")]
pub(crate) use softmax::exp_neg_avx512;
pub use softmax::{exp_neg, softmax_exp_with_isa, softmax_inplace};
