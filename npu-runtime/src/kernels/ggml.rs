//! Raw ggml blocks as stored in GGUF, decoded one block at a time into integer
//! codes plus scales. The type enum, block structs and sizes are the canonical
//! ones of `graphs::quant`; this module adds which types the repacked layouts
//! support and the decode the repacker and the scalar reference build on.

pub use graphs::quant::GgmlType;
use graphs::quant::{
    q5_values, scale_min_k4, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8_0, K_SCALE_SIZE, QK, QK_K,
};
use std::mem::offset_of;

/// The quantized types the repacked layouts support, in the order of the ISA
/// kernels' format index (`x86_*::fmt_type`).
pub(crate) const QUANT_TYPES: [GgmlType; 7] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
];

/// Whether `QMatrix` can repack and multiply tensors of type `ty`: the float
/// types and `QUANT_TYPES`.
pub fn kernel_supported(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16) || QUANT_TYPES.contains(&ty)
}

pub(crate) fn f16_bits_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// One 32-element block of a quantized row in canonical integer form:
/// `value[k] = d * (codes[k] - zero) + m` for the legacy formats,
/// `value[k] = d * sc * codes[k] - dmin * mq` for Q4_K (per 32-block `sc`, `mq`),
/// `value[k] = d * sc[k / 16] * (codes[k] - 32)` for Q6_K.
/// `d`, `m` are kept as raw f16 bits so the repacker can store them unchanged.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Block32 {
    pub codes: [u8; 32],
    /// f16 bits of the block (or super-block) scale.
    pub d: u16,
    /// f16 bits of the min (Q4_1, Q5_1) or super-block dmin (Q4_K).
    pub m: u16,
    /// Q4_K: 6-bit scale and min of this 32-block; Q6_K: the two i8 sub-scales.
    pub sc: [i16; 2],
}

/// Decode storage block `blk` (a `ty.type_size()` slice) into 32-element blocks.
/// Q4_K/Q6_K fill 8 entries, legacy formats 1. Byte offsets come from the
/// canonical `graphs::quant` block structs. Only `QUANT_TYPES` are handled here.
pub(crate) fn decode_block(ty: GgmlType, b: &[u8], out: &mut [Block32]) {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let (off, m) = if ty == GgmlType::Q4_0 {
                (offset_of!(BlockQ4_0, qs), 0)
            } else {
                (
                    offset_of!(BlockQ4_1, qs),
                    f16_bits_at(b, offset_of!(BlockQ4_1, m)),
                )
            };
            let o = &mut out[0];
            o.d = f16_bits_at(b, 0);
            o.m = m;
            for j in 0..QK / 2 {
                o.codes[j] = b[off + j] & 0xF;
                o.codes[j + QK / 2] = b[off + j] >> 4;
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let (qh_off, qs_off, m) = if ty == GgmlType::Q5_0 {
                (offset_of!(BlockQ5_0, qh), offset_of!(BlockQ5_0, qs), 0)
            } else {
                (
                    offset_of!(BlockQ5_1, qh),
                    offset_of!(BlockQ5_1, qs),
                    f16_bits_at(b, offset_of!(BlockQ5_1, m)),
                )
            };
            let o = &mut out[0];
            o.d = f16_bits_at(b, 0);
            o.m = m;
            let v = q5_values(u32_at(b, qh_off), &b[qs_off..qs_off + QK / 2]);
            for (c, v) in o.codes.iter_mut().zip(v) {
                *c = v as u8;
            }
        }
        GgmlType::Q8_0 => {
            let o = &mut out[0];
            o.d = f16_bits_at(b, offset_of!(BlockQ8_0, d));
            let qs = &b[offset_of!(BlockQ8_0, qs)..][..QK];
            for (c, &q) in o.codes.iter_mut().zip(qs) {
                // Stored offset by 128 so every format has unsigned codes.
                *c = (q as i8 as i16 + 128) as u8;
            }
        }
        GgmlType::Q4K => {
            let d = f16_bits_at(b, offset_of!(BlockQ4K, d));
            let dmin = f16_bits_at(b, offset_of!(BlockQ4K, dmin));
            let scales = &b[offset_of!(BlockQ4K, scales)..][..K_SCALE_SIZE];
            let qs = &b[offset_of!(BlockQ4K, qs)..][..QK_K / 2];
            for (j, o) in out.iter_mut().enumerate().take(8) {
                let (sc, mq) = scale_min_k4(j, scales);
                o.d = d;
                o.m = dmin;
                o.sc = [sc as i16, mq as i16];
                let q = &qs[32 * (j / 2)..32 * (j / 2) + 32];
                for (c, q) in o.codes.iter_mut().zip(q) {
                    *c = if j % 2 == 0 { q & 0xF } else { q >> 4 };
                }
            }
        }
        GgmlType::Q6K => {
            let ql = &b[offset_of!(BlockQ6K, ql)..][..QK_K / 2];
            let qh = &b[offset_of!(BlockQ6K, qh)..][..QK_K / 4];
            let sc = &b[offset_of!(BlockQ6K, scales)..][..QK_K / 16];
            let d = f16_bits_at(b, offset_of!(BlockQ6K, d));
            let mut v = [0u8; QK_K];
            for half in 0..2 {
                let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
                let y = &mut v[128 * half..];
                for l in 0..32 {
                    y[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
                    y[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                    y[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                    y[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                }
            }
            for (j, o) in out.iter_mut().enumerate().take(8) {
                o.codes.copy_from_slice(&v[32 * j..32 * j + 32]);
                o.d = d;
                o.sc = [sc[2 * j] as i8 as i16, sc[2 * j + 1] as i8 as i16];
            }
        }
        _ => unreachable!("{ty} is not a block-coded kernel type"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{KernelError, QMatrix};
    use super::*;

    /// Every type outside the kernels' set is refused with a clear error (not a
    /// panic in the repacker), and every type inside it is accepted.
    #[test]
    fn only_kernel_supported_types_are_repacked() {
        for ty in GgmlType::ALL {
            let cols = ty.block_size() * 8;
            let data = vec![0u8; ty.row_bytes(cols).unwrap()];
            let r = QMatrix::from_ggml(ty, 1, cols, &data);
            use GgmlType::*;
            let want = matches!(ty, F32 | F16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4K | Q6K);
            assert_eq!(kernel_supported(ty), want, "{ty}");
            if want {
                assert!(r.is_ok(), "{ty}");
            } else {
                assert_eq!(r.err(), Some(KernelError::UnsupportedType { ty }), "{ty}");
            }
        }
    }
}
