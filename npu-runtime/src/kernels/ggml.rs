//! Raw ggml block layouts as stored in GGUF, decoded one block at a time into
//! integer codes plus scales. This is the only place that knows the on-disk bit
//! layouts; the repacker and the scalar reference both build on it.

/// ggml tensor element types the kernels accept (variant names follow
/// `graphs::quant::GgmlType`).
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
    Q4K,
    Q6K,
}

impl GgmlType {
    /// Elements per storage block.
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
                32
            }
            GgmlType::Q4K | GgmlType::Q6K => 256,
        }
    }

    /// Bytes per storage block.
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q4K => 144,
            GgmlType::Q6K => 210,
        }
    }

    /// Bytes of one row of `n` elements, `None` if `n` is not a block multiple.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.type_size())
    }
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
/// Q4_K/Q6_K fill 8 entries, legacy formats 1. F32/F16 are not handled here.
pub(crate) fn decode_block(ty: GgmlType, b: &[u8], out: &mut [Block32]) {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let off = if ty == GgmlType::Q4_0 { 2 } else { 4 };
            let o = &mut out[0];
            o.d = f16_bits_at(b, 0);
            o.m = if ty == GgmlType::Q4_1 {
                f16_bits_at(b, 2)
            } else {
                0
            };
            for j in 0..16 {
                o.codes[j] = b[off + j] & 0xF;
                o.codes[j + 16] = b[off + j] >> 4;
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let (qh_off, qs_off) = if ty == GgmlType::Q5_0 { (2, 6) } else { (4, 8) };
            let o = &mut out[0];
            o.d = f16_bits_at(b, 0);
            o.m = if ty == GgmlType::Q5_1 {
                f16_bits_at(b, 2)
            } else {
                0
            };
            let qh = u32_at(b, qh_off);
            for j in 0..16 {
                let h0 = (((qh >> j) & 1) << 4) as u8;
                let h1 = (((qh >> (j + 16)) & 1) << 4) as u8;
                o.codes[j] = (b[qs_off + j] & 0xF) | h0;
                o.codes[j + 16] = (b[qs_off + j] >> 4) | h1;
            }
        }
        GgmlType::Q8_0 => {
            let o = &mut out[0];
            o.d = f16_bits_at(b, 0);
            for j in 0..32 {
                // Stored offset by 128 so every format has unsigned codes.
                o.codes[j] = (b[2 + j] as i8 as i16 + 128) as u8;
            }
        }
        GgmlType::Q4K => {
            let d = f16_bits_at(b, 0);
            let dmin = f16_bits_at(b, 2);
            let scales = &b[4..16];
            let qs = &b[16..144];
            for (j, o) in out.iter_mut().enumerate().take(8) {
                let (sc, mq) = q4k_scale_min(j, scales);
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
            let ql = &b[0..128];
            let qh = &b[128..192];
            let sc = &b[192..208];
            let d = f16_bits_at(b, 208);
            let mut v = [0u8; 256];
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
        GgmlType::F32 | GgmlType::F16 => unreachable!("float types are not block-coded"),
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j`.
fn q4k_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}
