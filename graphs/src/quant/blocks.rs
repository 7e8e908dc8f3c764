//! `#[repr(C)]` block structs with the exact ggml layouts, for kernels that want
//! typed access. Sizes are asserted at compile time.

use half::f16;
use std::mem::size_of;

use super::{QK, QK_K};

/// Bytes of the packed 6-bit scales/mins of Q4_K and Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// 32 weights: `x = d * (q - 8)`, q in 0..16; low nibbles are elements 0..16,
/// high nibbles 16..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}

/// 32 weights: `x = d * q + m`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}

/// 32 weights: `x = d * (q - 16)`, q in 0..32; bit 4 of element j is bit j of
/// the little-endian u32 `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// 32 weights: `x = d * q + m`, q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// 32 weights: `x = d * q`, q signed 8-bit.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}

/// 32 weights: `x = d * q`; `s = d * sum(q)` (used by dot products with Q4_1/Q5_1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK],
}

/// 256 weights in 16 sub-blocks of 16: `x = d*(sc&15)*q - dmin*(sc>>4)`, q 2-bit.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: f16,
    pub dmin: f16,
}

/// 256 weights in 16 sub-blocks of 16: 2 low bits in `qs`, high bit in `hmask`,
/// 6-bit signed scales packed in 12 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: f16,
}

/// 256 weights in 8 sub-blocks of 32: `x = d*sc*q - dmin*m`, q 4-bit, 6-bit sc/m.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// 256 weights in 8 sub-blocks of 32: as Q4_K with a fifth bit in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// 256 weights in 16 sub-blocks of 16: `x = d * sc * (q - 32)`, q 6-bit
/// (4 low bits in `ql`, 2 high bits in `qh`), sc signed 8-bit.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}

/// 256 weights: `x = d * q` with an f32 scale; `bsums[i]` = sum of q over
/// elements 16i..16i+16 (used by k-quant dot products).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

const _: () = assert!(size_of::<BlockQ4_0>() == 18);
const _: () = assert!(size_of::<BlockQ4_1>() == 20);
const _: () = assert!(size_of::<BlockQ5_0>() == 22);
const _: () = assert!(size_of::<BlockQ5_1>() == 24);
const _: () = assert!(size_of::<BlockQ8_0>() == 34);
const _: () = assert!(size_of::<BlockQ8_1>() == 36);
const _: () = assert!(size_of::<BlockQ2K>() == 84);
const _: () = assert!(size_of::<BlockQ3K>() == 110);
const _: () = assert!(size_of::<BlockQ4K>() == 144);
const _: () = assert!(size_of::<BlockQ5K>() == 176);
const _: () = assert!(size_of::<BlockQ6K>() == 210);
const _: () = assert!(size_of::<BlockQ8K>() == 292);
