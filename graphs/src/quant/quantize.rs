//! Reference quantizers. The legacy formats (Q4_0 .. Q8_1, Q8_K) follow ggml's
//! reference rounding exactly; the k-quants (Q4_K, Q5_K, Q6_K) use a simple
//! min/max fit per sub-block instead of ggml's iterative search, which yields
//! valid blocks with a slightly larger (still bounded) error. They exist to make
//! test weights, not to produce model files.

use half::f16;

use super::{check_sizes, GgmlType, QuantError, QK, QK_K};

/// Quantize one row of `src.len()` elements into `dst`, which must hold exactly
/// `ty.row_bytes(src.len())` bytes.
pub fn quantize_row_ref(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    check_sizes(ty, src.len(), dst.len())?;
    if !ty.has_ref_quantizer() {
        return Err(QuantError::NoQuantizer { ty: ty.name() });
    }
    let bs = ty.block_size();
    let ts = ty.type_size();
    for (x, b) in src.chunks_exact(bs).zip(dst.chunks_exact_mut(ts)) {
        match ty {
            GgmlType::F32 => b.copy_from_slice(&x[0].to_le_bytes()),
            GgmlType::F16 => b.copy_from_slice(&f16::from_f32(x[0]).to_le_bytes()),
            GgmlType::BF16 => b.copy_from_slice(&half::bf16::from_f32(x[0]).to_le_bytes()),
            GgmlType::Q4_0 => q4_0(x, b),
            GgmlType::Q4_1 => q4_1(x, b),
            GgmlType::Q5_0 => q5_0(x, b),
            GgmlType::Q5_1 => q5_1(x, b),
            GgmlType::Q8_0 => q8_0(x, b),
            GgmlType::Q8_1 => q8_1(x, b),
            GgmlType::Q8K => q8_k(x, b),
            GgmlType::Q4K => qk_k_asym(x, b, 15),
            GgmlType::Q5K => qk_k_asym(x, b, 31),
            GgmlType::Q6K => q6_k(x, b),
            GgmlType::Q2K | GgmlType::Q3K => unreachable!("checked by has_ref_quantizer"),
        }
    }
    Ok(())
}

fn put_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// The element with the largest magnitude, keeping its sign.
fn signed_absmax(x: &[f32]) -> f32 {
    let mut best = 0.0f32;
    for &v in x {
        if v.abs() > best.abs() {
            best = v;
        }
    }
    best
}

fn inv(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

fn q4_0(x: &[f32], b: &mut [u8]) {
    let d = signed_absmax(x) / -8.0;
    let id = inv(d);
    put_f16(b, 0, d);
    for j in 0..QK / 2 {
        let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let q1 = ((x[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
        b[2 + j] = q0 | (q1 << 4);
    }
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

fn q4_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inv(d);
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    for j in 0..QK / 2 {
        let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
        let q1 = (((x[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
        b[4 + j] = q0 | (q1 << 4);
    }
}

/// Pack 32 five-bit values into (qh, qs).
fn pack_q5(q: &[u8; QK], qh_out: &mut [u8], qs_out: &mut [u8]) {
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let (q0, q1) = (q[j], q[j + QK / 2]);
        qs_out[j] = (q0 & 0xF) | ((q1 & 0xF) << 4);
        qh |= (((q0 & 0x10) >> 4) as u32) << j;
        qh |= (((q1 & 0x10) >> 4) as u32) << (j + QK / 2);
    }
    qh_out.copy_from_slice(&qh.to_le_bytes());
}

fn q5_0(x: &[f32], b: &mut [u8]) {
    let d = signed_absmax(x) / -16.0;
    let id = inv(d);
    put_f16(b, 0, d);
    let mut q = [0u8; QK];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = ((v * id + 16.5) as i8).min(31) as u8;
    }
    let (qh, qs) = b[2..].split_at_mut(4);
    pack_q5(&q, qh, qs);
}

fn q5_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inv(d);
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    let mut q = [0u8; QK];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (((v - min) * id + 0.5) as i8).min(31) as u8;
    }
    let (qh, qs) = b[4..].split_at_mut(4);
    pack_q5(&q, qh, qs);
}

fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

fn q8_0(x: &[f32], b: &mut [u8]) {
    let d = absmax(x) / 127.0;
    let id = inv(d);
    put_f16(b, 0, d);
    for j in 0..QK {
        b[2 + j] = (x[j] * id).round() as i8 as u8;
    }
}

fn q8_1(x: &[f32], b: &mut [u8]) {
    let d = absmax(x) / 127.0;
    let id = inv(d);
    let mut sum = 0i32;
    for j in 0..QK {
        let q = (x[j] * id).round() as i8;
        sum += q as i32;
        b[4 + j] = q as u8;
    }
    put_f16(b, 0, d);
    put_f16(b, 2, sum as f32 * d);
}

fn q8_k(x: &[f32], b: &mut [u8]) {
    let max = signed_absmax(x);
    if max == 0.0 {
        b.fill(0);
        return;
    }
    let iscale = -127.0 / max;
    for j in 0..QK_K {
        b[4 + j] = ((iscale * x[j]).round() as i32).min(127) as i8 as u8;
    }
    for s in 0..QK_K / 16 {
        let sum: i32 = (0..16).map(|l| b[4 + s * 16 + l] as i8 as i32).sum();
        let at = 4 + QK_K + 2 * s;
        b[at..at + 2].copy_from_slice(&(sum as i16).to_le_bytes());
    }
    b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}

/// Q4_K (`nmax` = 15) and Q5_K (`nmax` = 31): 8 sub-blocks of 32, each
/// `x ~= d*sc*q - dmin*m` with 6-bit sc and m.
fn qk_k_asym(x: &[f32], b: &mut [u8], nmax: u8) {
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    for (s, sub) in x.chunks_exact(32).enumerate() {
        let (lo, hi) = min_max(sub);
        let lo = lo.min(0.0); // the format stores a non-negative offset
        scales[s] = (hi - lo) / nmax as f32;
        mins[s] = -lo;
    }
    let max_scale = scales.iter().fold(0f32, |a, &v| a.max(v));
    let max_min = mins.iter().fold(0f32, |a, &v| a.max(v));
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);
    let (df, dminf) = (d.to_f32(), dmin.to_f32());
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for s in 0..8 {
        ls[s] = (scales[s] * inv(df)).round().clamp(0.0, 63.0) as u8;
        lm[s] = (mins[s] * inv(dminf)).round().clamp(0.0, 63.0) as u8;
    }
    b[0..2].copy_from_slice(&d.to_le_bytes());
    b[2..4].copy_from_slice(&dmin.to_le_bytes());
    let packed = pack_scale_min_k4(&ls, &lm);
    b[4..16].copy_from_slice(&packed);
    let mut q = [0u8; QK_K];
    for s in 0..8 {
        let step = df * ls[s] as f32;
        let off = dminf * lm[s] as f32;
        let istep = inv(step);
        for l in 0..32 {
            let v = ((x[s * 32 + l] + off) * istep).round();
            q[s * 32 + l] = v.clamp(0.0, nmax as f32) as u8;
        }
    }
    let (qh, qs) = if nmax == 15 {
        (None, &mut b[16..144])
    } else {
        let (qh, qs) = b[16..176].split_at_mut(32);
        (Some(qh), qs)
    };
    for pair in 0..4 {
        for l in 0..32 {
            let lo = q[pair * 64 + l];
            let hi = q[pair * 64 + 32 + l];
            qs[pair * 32 + l] = (lo & 0xF) | ((hi & 0xF) << 4);
        }
    }
    if let Some(qh) = qh {
        qh.fill(0);
        for pair in 0..4 {
            for l in 0..32 {
                if q[pair * 64 + l] & 0x10 != 0 {
                    qh[l] |= 1 << (2 * pair);
                }
                if q[pair * 64 + 32 + l] & 0x10 != 0 {
                    qh[l] |= 2 << (2 * pair);
                }
            }
        }
    }
}

/// Inverse of `scale_min_k4`: pack 8 six-bit scales and mins into 12 bytes.
pub(crate) fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

fn q6_k(x: &[f32], b: &mut [u8]) {
    // Per sub-block of 16: the signed scale that maps the extreme to -32.
    let mut sub_scale = [0f32; 16];
    for (s, sub) in x.chunks_exact(16).enumerate() {
        sub_scale[s] = signed_absmax(sub) / -32.0;
    }
    let max_scale = signed_absmax(&sub_scale);
    let mut sc = [0i8; 16];
    let d = if max_scale == 0.0 {
        0.0
    } else {
        let iscale = -128.0 / max_scale;
        for s in 0..16 {
            sc[s] = (iscale * sub_scale[s]).round().clamp(-128.0, 127.0) as i8;
        }
        1.0 / iscale
    };
    let d16 = f16::from_f32(d);
    let df = d16.to_f32();
    let mut q = [0u8; QK_K];
    for s in 0..16 {
        let step = df * sc[s] as f32;
        let istep = inv(step);
        for l in 0..16 {
            let v = (x[s * 16 + l] * istep).round().clamp(-32.0, 31.0) as i32;
            q[s * 16 + l] = (v + 32) as u8;
        }
    }
    let (ql, rest) = b.split_at_mut(128);
    let (qh, rest) = rest.split_at_mut(64);
    let (scales, dbytes) = rest.split_at_mut(16);
    for half in 0..2 {
        let q = &q[half * 128..half * 128 + 128];
        let ql = &mut ql[half * 64..half * 64 + 64];
        let qh = &mut qh[half * 32..half * 32 + 32];
        for l in 0..32 {
            ql[l] = (q[l] & 0xF) | ((q[l + 64] & 0xF) << 4);
            ql[l + 32] = (q[l + 32] & 0xF) | ((q[l + 96] & 0xF) << 4);
            qh[l] = (q[l] >> 4)
                | ((q[l + 32] >> 4) << 2)
                | ((q[l + 64] >> 4) << 4)
                | ((q[l + 96] >> 4) << 6);
        }
    }
    for s in 0..16 {
        scales[s] = sc[s] as u8;
    }
    dbytes.copy_from_slice(&d16.to_le_bytes());
}
