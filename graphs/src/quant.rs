//! ggml tensor types: block layouts, scalar reference dequantization (the oracle
//! every SIMD kernel is tested against) and reference quantizers (used by tests to
//! make random weights).
//!
//! Layouts follow ggml exactly (little-endian, `#[repr(C)]`, sizes asserted at
//! compile time). The reference code reads raw bytes, so it needs no `unsafe`.

mod blocks;
mod dequant;
mod quantize;

pub use blocks::*;
pub use dequant::{dequantize_row, q5_values, scale_min_k4};
pub use quantize::quantize_row_ref;

/// Elements per super-block of the k-quants.
pub const QK_K: usize = 256;
/// Elements per block of the legacy quants (Q4_0 .. Q8_1).
pub const QK: usize = 32;

/// A ggml tensor element type (only the ones this crate can dequantize).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    BF16,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantError {
    #[error("{ty}: row of {n} elements is not a multiple of the block size {block}")]
    NotBlockMultiple {
        ty: &'static str,
        n: usize,
        block: usize,
    },
    #[error("{ty}: source has {got} bytes, expected {expected} for {n} elements")]
    SizeMismatch {
        ty: &'static str,
        n: usize,
        got: usize,
        expected: usize,
    },
    #[error("{ty}: no reference quantizer for this type")]
    NoQuantizer { ty: &'static str },
}

impl GgmlType {
    pub const ALL: [GgmlType; 15] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8K,
        GgmlType::BF16,
    ];

    /// The ggml type id as stored in GGUF (`enum ggml_type`).
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            9 => GgmlType::Q8_1,
            10 => GgmlType::Q2K,
            11 => GgmlType::Q3K,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            15 => GgmlType::Q8K,
            30 => GgmlType::BF16,
            _ => return None,
        })
    }

    pub fn to_u32(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::Q2K => 10,
            GgmlType::Q3K => 11,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::Q8K => 15,
            GgmlType::BF16 => 30,
        }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q8_1 => QK,
            GgmlType::Q2K
            | GgmlType::Q3K
            | GgmlType::Q4K
            | GgmlType::Q5K
            | GgmlType::Q6K
            | GgmlType::Q8K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        use std::mem::size_of;
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => size_of::<BlockQ4_0>(),
            GgmlType::Q4_1 => size_of::<BlockQ4_1>(),
            GgmlType::Q5_0 => size_of::<BlockQ5_0>(),
            GgmlType::Q5_1 => size_of::<BlockQ5_1>(),
            GgmlType::Q8_0 => size_of::<BlockQ8_0>(),
            GgmlType::Q8_1 => size_of::<BlockQ8_1>(),
            GgmlType::Q2K => size_of::<BlockQ2K>(),
            GgmlType::Q3K => size_of::<BlockQ3K>(),
            GgmlType::Q4K => size_of::<BlockQ4K>(),
            GgmlType::Q5K => size_of::<BlockQ5K>(),
            GgmlType::Q6K => size_of::<BlockQ6K>(),
            GgmlType::Q8K => size_of::<BlockQ8K>(),
        }
    }

    /// Bytes of a row of `n` elements; `None` if `n` is not a multiple of the block
    /// size or the size overflows.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.type_size())
    }

    /// The ggml name (`q4_K`, `f32`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q8_1 => "q8_1",
            GgmlType::Q2K => "q2_K",
            GgmlType::Q3K => "q3_K",
            GgmlType::Q4K => "q4_K",
            GgmlType::Q5K => "q5_K",
            GgmlType::Q6K => "q6_K",
            GgmlType::Q8K => "q8_K",
            GgmlType::BF16 => "bf16",
        }
    }

    /// Whether `quantize_row_ref` supports this type.
    pub fn has_ref_quantizer(self) -> bool {
        !matches!(self, GgmlType::Q2K | GgmlType::Q3K)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Name of a ggml type id this crate does not support, for error messages.
pub fn unsupported_type_name(v: u32) -> &'static str {
    match v {
        4 | 5 => "q4_2/q4_3 (removed)",
        16 => "iq2_xxs",
        17 => "iq2_xs",
        18 => "iq3_xxs",
        19 => "iq1_s",
        20 => "iq4_nl",
        21 => "iq3_s",
        22 => "iq2_s",
        23 => "iq4_xs",
        24 => "i8",
        25 => "i16",
        26 => "i32",
        27 => "i64",
        28 => "f64",
        29 => "iq1_m",
        31..=33 => "q4_0_4_4/q4_0_4_8/q4_0_8_8 (removed)",
        34 => "tq1_0",
        35 => "tq2_0",
        36..=38 => "iq4_nl_4_4/4_8/8_8 (removed)",
        39 => "mxfp4",
        _ => "unknown",
    }
}

fn check_sizes(ty: GgmlType, n: usize, bytes: usize) -> Result<(), QuantError> {
    let expected = ty.row_bytes(n).ok_or(QuantError::NotBlockMultiple {
        ty: ty.name(),
        n,
        block: ty.block_size(),
    })?;
    if bytes != expected {
        return Err(QuantError::SizeMismatch {
            ty: ty.name(),
            n,
            got: bytes,
            expected,
        });
    }
    Ok(())
}
