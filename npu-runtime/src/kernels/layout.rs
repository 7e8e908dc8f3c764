//! The repacked weight layout the kernels read.
//!
//! Rows are grouped 16 at a time (the row count is padded with zero rows). A
//! group stores, for each 32-column block, its codes interleaved so that one
//! 64-byte vector holds 4 consecutive codes of each of the 16 rows: an int8
//! dot-product instruction (`vpdpbusd`) with the token's 4 activations
//! broadcast then yields the 16 rows' partial sums in 16 lanes, and no
//! horizontal reduction is ever needed. Each group is three contiguous planes
//! (all 64-byte aligned):
//!
//! * codes: 4/5/6-bit formats: per block 4 vectors; byte `4i+e` of vector `p`
//!   = code(row i, col 4p+e) | code(row i, col 4(p+4)+e) << 4.
//!   Q8_0: per block 8 vectors, byte `4i+e` of vector `c` = code(row i, col 4c+e).
//! * high bits: Q5: per block 8 little-endian u64 masks, bit `4i+e` of mask `c`
//!   = bit 4 of code(row i, col 4c+e). Q6_K: per block 2 vectors, byte `4i+e` of
//!   vector `q` holds bits 4..6 of the code of chunk `4q+k` at bits `2k..2k+2`.
//! * scales: Q4_0/Q5_0/Q8_0: per block d[16] (f16). Q4_1/Q5_1: per block d[16],
//!   m[16] (f16). Q4_K: per super-block d[16], dmin[16] (f16), then sc[16] (u8)
//!   for each of its 8 blocks, then for each block pair p the mins interleaved
//!   as 32 bytes, byte `2i+e` = mq(row i, block 2p+e) (u8), so that widening to
//!   i16 puts row i's two mins in lane i for one `vpdpwssd`. Q6_K: per
//!   super-block d[16] (f16) + 32 pad bytes, then per block 32 bytes, byte
//!   `2i+e` = sub-scale e (first / second 16 columns) of row i (i8).
//!
//! F32/F16: per column k, the 16 rows' values (64 / 32 bytes), no planes.
//!
//! Size versus GGUF: identical for the legacy formats and Q6_K; Q4_K grows by
//! 1/72 (its 6-bit scales are unpacked to bytes); plus row padding to 16.

use half::f16;

use super::ggml::{decode_block, Block32, GgmlType};
use graphs::quant::scale_min_k4;

pub(crate) const GROUP: usize = 16;

/// Byte sizes of one group's planes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Planes {
    pub codes: usize,
    pub high: usize,
    pub scales: usize,
}

impl Planes {
    pub fn new(ty: GgmlType, cols: usize) -> Planes {
        let (codes, high, scales) = match ty {
            GgmlType::F32 => (cols * 64, 0, 0),
            GgmlType::F16 => (cols * 32, 0, 0),
            _ => {
                let (c, h, s) = block_plane_bytes(ty);
                let nb = cols / 32;
                (nb * c, nb * h, nb * s)
            }
        };
        Planes {
            codes,
            high,
            scales: scales.next_multiple_of(64),
        }
    }

    pub fn group_bytes(&self) -> usize {
        self.codes + self.high + self.scales
    }
}

/// Bytes one 32-column block of a quantized format takes in each plane (codes,
/// high bits, scales); a K-quant super-block's 320 scale bytes are 40 per block.
#[inline(always)]
pub(crate) fn block_plane_bytes(ty: GgmlType) -> (usize, usize, usize) {
    match ty {
        GgmlType::Q4_0 => (256, 0, 32),
        GgmlType::Q5_0 => (256, 64, 32),
        GgmlType::Q4_1 => (256, 0, 64),
        GgmlType::Q5_1 => (256, 64, 64),
        GgmlType::Q8_0 => (512, 0, 32),
        GgmlType::Q4K => (256, 0, 40),
        GgmlType::Q6K => (256, 128, 40),
        _ => unreachable!("{ty} is not a kernel type (QMatrix::from_ggml checks)"),
    }
}

/// Writes into `dst` (a Q5_0 group of `nb` blocks, zeroed) the coarse copy of the Q8_0
/// group `src` that the screened LM head reads (`screen`): code `u = (q >> 3) + 16`
/// and scale `8·d` for every code `q` and scale `d`. Works on the packed planes
/// directly (both formats put code (row i, col 4c+e) at byte 4i+e of the block's
/// vector c, Q5_0 folding c and c+4 into one byte's nibbles). Whether every `8·d` is
/// exact is the caller's to check (`ArgmaxScreen::with_coarse`).
pub(crate) fn coarse_q5_0_group(nb: usize, src: &[u8], dst: &mut [u8]) {
    let (p8, p5) = (
        Planes::new(GgmlType::Q8_0, nb * 32),
        Planes::new(GgmlType::Q5_0, nb * 32),
    );
    let (codes8, scales8) = (&src[..p8.codes], &src[p8.codes..]);
    let (codes5, rest) = dst.split_at_mut(p5.codes);
    let (high5, scales5) = rest.split_at_mut(p5.high);
    for b in 0..nb {
        let c8 = &codes8[b * 512..(b + 1) * 512];
        let c5 = &mut codes5[b * 256..(b + 1) * 256];
        let h5 = &mut high5[b * 64..(b + 1) * 64];
        for (c, v) in c8.chunks_exact(64).enumerate() {
            // Stored biased: q + 128, and (q >> 3) + 16 = (q + 128) >> 3.
            let mut u = [0u8; 64];
            for (u, &byte) in u.iter_mut().zip(v) {
                *u = byte >> 3;
            }
            let shift = 4 * (c / 4);
            for (o, &u) in c5[(c % 4) * 64..(c % 4) * 64 + 64].iter_mut().zip(&u) {
                *o |= (u & 15) << shift;
            }
            // Bit 4 of 8 bytes at a time into 8 mask bits (byte j -> bit j).
            for (w, m) in u.chunks_exact(8).zip(h5[c * 8..c * 8 + 8].iter_mut()) {
                let bits = (u64::from_le_bytes(w.try_into().unwrap()) >> 4) & 0x0101_0101_0101_0101;
                *m = (bits.wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8;
            }
        }
        for i in 0..GROUP {
            let at = b * 32 + 2 * i;
            let d = f16::from_le_bytes([scales8[at], scales8[at + 1]]).to_f32();
            scales5[at..at + 2].copy_from_slice(&f16::from_f32(8.0 * d).to_le_bytes());
        }
    }
}

/// The scales `d` of a Q4_0/Q5_0/Q8_0 group of `nb` blocks into `out`, row-major
/// (`out[i * nb + b]` for row i, block b; as many rows as `out` holds).
pub(crate) fn legacy_scales(ty: GgmlType, nb: usize, group: &[u8], out: &mut [f32]) {
    let p = Planes::new(ty, nb * 32);
    let scales = &group[p.codes + p.high..];
    for (i, row) in out.chunks_exact_mut(nb).enumerate() {
        for (b, d) in row.iter_mut().enumerate() {
            *d = f16_get(&scales[b * 32..], i);
        }
    }
}

/// Offsets inside a K-quant super-block's 320 scale bytes (see the module docs).
pub(crate) const Q4K_SC: usize = 64;
pub(crate) const Q4K_MQ: usize = 192;
pub(crate) const Q6K_SUB: usize = 64;

/// The `zero` subtracted from codes in the canonical integer sum.
pub(crate) fn zero_point(ty: GgmlType) -> i32 {
    match ty {
        GgmlType::Q4_0 => 8,
        GgmlType::Q5_0 => 16,
        GgmlType::Q8_0 => 128,
        GgmlType::Q6K => 32,
        _ => 0,
    }
}

fn put_f16(dst: &mut [u8], i: usize, bits: u16) {
    dst[2 * i..2 * i + 2].copy_from_slice(&bits.to_le_bytes());
}

/// A hash of the bytes [`pack_group`] writes for fixed pseudo-random rows of every
/// supported type (and of the plane sizes): it changes whenever the layout does, so a
/// cache of repacked weights made by another layout is never used (`weights_cache`).
pub fn layout_fingerprint() -> u64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut h = graphs::fnv::Fnv1a::default();
    let mut types = vec![GgmlType::F32, GgmlType::F16];
    types.extend(super::ggml::QUANT_TYPES);
    for ty in types {
        let cols = 512;
        let rb = ty
            .row_bytes(cols)
            .expect("512 columns fit every block size");
        let rows: Vec<Vec<u8>> = (0..GROUP)
            .map(|_| {
                (0..rb)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect()
            })
            .collect();
        let refs: Vec<&[u8]> = rows.iter().map(|r| r.as_slice()).collect();
        let p = Planes::new(ty, cols);
        let mut group = vec![0u8; p.group_bytes()];
        pack_group(ty, cols, &refs, &p, &mut group);
        for v in [ty.to_u32() as usize, GROUP, p.codes, p.high, p.scales] {
            h.write(&v.to_le_bytes());
        }
        h.write(&group);
    }
    h.0
}

/// Repack one group of up to 16 rows (`src_rows[i]` = ggml bytes of row i).
pub(crate) fn pack_group(
    ty: GgmlType,
    cols: usize,
    src_rows: &[&[u8]],
    p: &Planes,
    dst: &mut [u8],
) {
    let (codes, rest) = dst.split_at_mut(p.codes);
    let (high, scales) = rest.split_at_mut(p.high);
    match ty {
        GgmlType::F32 | GgmlType::F16 => {
            let es = if ty == GgmlType::F32 { 4 } else { 2 };
            for (i, row) in src_rows.iter().enumerate() {
                for k in 0..cols {
                    let o = k * GROUP * es + i * es;
                    codes[o..o + es].copy_from_slice(&row[k * es..(k + 1) * es]);
                }
            }
            return;
        }
        _ => {}
    }
    for (i, row) in src_rows.iter().enumerate() {
        if !pack_row_direct(ty, i, row, codes, high, scales) {
            pack_row_decoded(ty, i, row, codes, high, scales);
        }
    }
}

/// Packs row `i` of a group through [`decode_block`] (any quantized format): the
/// reference that [`pack_row_direct`] reproduces.
fn pack_row_decoded(
    ty: GgmlType,
    i: usize,
    row: &[u8],
    codes: &mut [u8],
    high: &mut [u8],
    scales: &mut [u8],
) {
    let per = ty.block_size() / 32;
    let mut blocks = [Block32::default(); 8];
    {
        for (sb, raw) in row.chunks_exact(ty.type_size()).enumerate() {
            decode_block(ty, raw, &mut blocks[..per]);
            for (j, blk) in blocks[..per].iter().enumerate() {
                let b = sb * per + j;
                put_codes(ty, b, i, &blk.codes, codes, high);
                match ty {
                    GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => {
                        put_f16(&mut scales[b * 32..], i, blk.d)
                    }
                    GgmlType::Q4_1 | GgmlType::Q5_1 => {
                        put_f16(&mut scales[b * 64..], i, blk.d);
                        put_f16(&mut scales[b * 64 + 32..], i, blk.m);
                    }
                    GgmlType::Q4K => {
                        let s = &mut scales[sb * 320..(sb + 1) * 320];
                        put_f16(s, i, blk.d);
                        put_f16(&mut s[32..], i, blk.m);
                        s[Q4K_SC + 16 * j + i] = blk.sc[0] as u8;
                        s[Q4K_MQ + 32 * (j / 2) + 2 * i + j % 2] = blk.sc[1] as u8;
                    }
                    GgmlType::Q6K => {
                        let s = &mut scales[sb * 320..(sb + 1) * 320];
                        put_f16(s, i, blk.d);
                        s[Q6K_SUB + 32 * j + 2 * i] = blk.sc[0] as u8;
                        s[Q6K_SUB + 32 * j + 2 * i + 1] = blk.sc[1] as u8;
                    }
                    _ => unreachable!(),
                }
            }
        }
    }
}

/// Row `i`'s 16 code bytes of a block (`nib[k]` = low nibble of code k | low nibble of
/// code k + 16, shifted) go to bytes `4i..4i+4` of the block's 4 vectors.
#[inline(always)]
fn put_nibbles(codes: &mut [u8], b: usize, i: usize, nib: &[u8; 16]) {
    let v = &mut codes[b * 256..(b + 1) * 256];
    for p in 0..4 {
        v[p * 64 + 4 * i..p * 64 + 4 * i + 4].copy_from_slice(&nib[4 * p..4 * p + 4]);
    }
}

/// The code bytes of a block whose codes' low nibbles are the low (`upper = false`) or
/// high nibbles of `q[0..32]` (ggml's Q4_K/Q6_K sub-block pairs).
#[inline(always)]
fn nibbles_of(q: &[u8], upper: bool) -> [u8; 16] {
    std::array::from_fn(|k| {
        if upper {
            (q[k] >> 4) | (q[k + 16] & 0xF0)
        } else {
            (q[k] & 0xF) | (q[k + 16] << 4)
        }
    })
}

/// Packs row `i` of a group straight from the ggml bytes for the formats models use
/// (the same bytes as [`pack_row_decoded`], without the per-code decode and scatter
/// that made loading slow: benchmarks/runs/kernels-worklog.md#item-44); `false` for the
/// other formats.
fn pack_row_direct(
    ty: GgmlType,
    i: usize,
    row: &[u8],
    codes: &mut [u8],
    high: &mut [u8],
    scales: &mut [u8],
) -> bool {
    match ty {
        GgmlType::Q8_0 => {
            for (b, raw) in row.chunks_exact(34).enumerate() {
                put_f16(
                    &mut scales[b * 32..],
                    i,
                    u16::from_le_bytes([raw[0], raw[1]]),
                );
                let v = &mut codes[b * 512..(b + 1) * 512];
                for c in 0..8 {
                    for e in 0..4 {
                        // Codes are stored biased: q + 128 = q ^ 0x80 as a byte.
                        v[c * 64 + 4 * i + e] = raw[2 + 4 * c + e] ^ 0x80;
                    }
                }
            }
        }
        GgmlType::Q4_0 | GgmlType::Q5_0 => {
            let q5 = ty == GgmlType::Q5_0;
            let (ts, qs) = if q5 { (22, 6) } else { (18, 2) };
            for (b, raw) in row.chunks_exact(ts).enumerate() {
                put_f16(
                    &mut scales[b * 32..],
                    i,
                    u16::from_le_bytes([raw[0], raw[1]]),
                );
                // ggml's qs[k] already is code k | code k + 16 << 4 (low nibbles).
                let nib: &[u8; 16] = raw[qs..qs + 16].try_into().expect("16 bytes");
                put_nibbles(codes, b, i, nib);
                if q5 {
                    // Bit 4 of code k is bit k of qh; chunk c's four bits share a byte
                    // with the neighbouring row's.
                    let qh = u32::from_le_bytes([raw[2], raw[3], raw[4], raw[5]]);
                    let h = &mut high[b * 64..(b + 1) * 64];
                    for c in 0..8 {
                        h[c * 8 + i / 2] |= (((qh >> (4 * c)) & 0xF) as u8) << (4 * (i % 2));
                    }
                }
            }
        }
        GgmlType::Q4K => {
            for (sb, raw) in row.chunks_exact(144).enumerate() {
                let (sc, qs) = (&raw[4..16], &raw[16..144]);
                let s = &mut scales[sb * 320..(sb + 1) * 320];
                put_f16(s, i, u16::from_le_bytes([raw[0], raw[1]]));
                put_f16(&mut s[32..], i, u16::from_le_bytes([raw[2], raw[3]]));
                for j in 0..8 {
                    let (scale, min) = scale_min_k4(j, sc);
                    s[Q4K_SC + 16 * j + i] = scale;
                    s[Q4K_MQ + 32 * (j / 2) + 2 * i + j % 2] = min;
                    let nib = nibbles_of(&qs[32 * (j / 2)..32 * (j / 2) + 32], j % 2 == 1);
                    put_nibbles(codes, sb * 8 + j, i, &nib);
                }
            }
        }
        GgmlType::Q6K => {
            for (sb, raw) in row.chunks_exact(210).enumerate() {
                let (ql, qh, sc) = (&raw[..128], &raw[128..192], &raw[192..208]);
                let s = &mut scales[sb * 320..(sb + 1) * 320];
                put_f16(s, i, u16::from_le_bytes([raw[208], raw[209]]));
                for j in 0..8 {
                    let (half, r) = (j / 4, j % 4);
                    s[Q6K_SUB + 32 * j + 2 * i] = sc[2 * j];
                    s[Q6K_SUB + 32 * j + 2 * i + 1] = sc[2 * j + 1];
                    let l0 = 64 * half + 32 * (r % 2);
                    let b = sb * 8 + j;
                    put_nibbles(codes, b, i, &nibbles_of(&ql[l0..l0 + 32], r >= 2));
                    // Bits 4..6 of code 16q + 4kk + e at bits 2kk.. of byte 4i + e of vector q.
                    let q2 = &qh[32 * half..32 * half + 32];
                    let h = &mut high[b * 128..(b + 1) * 128];
                    for q in 0..2 {
                        for e in 0..4 {
                            h[q * 64 + 4 * i + e] = (0..4).fold(0u8, |acc, kk| {
                                acc | ((q2[16 * q + 4 * kk + e] >> (2 * r)) & 3) << (2 * kk)
                            });
                        }
                    }
                }
            }
        }
        _ => return false,
    }
    true
}

fn put_codes(ty: GgmlType, b: usize, i: usize, c: &[u8; 32], codes: &mut [u8], high: &mut [u8]) {
    match ty {
        GgmlType::Q8_0 => {
            let v = &mut codes[b * 512..(b + 1) * 512];
            for (k, &code) in c.iter().enumerate() {
                v[(k / 4) * 64 + 4 * i + k % 4] = code;
            }
        }
        _ => {
            let v = &mut codes[b * 256..(b + 1) * 256];
            for p in 0..4 {
                for e in 0..4 {
                    let lo = c[4 * p + e] & 0xF;
                    let hi = c[4 * (p + 4) + e] & 0xF;
                    v[p * 64 + 4 * i + e] = lo | (hi << 4);
                }
            }
            if matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1) {
                let h = &mut high[b * 64..(b + 1) * 64];
                for (k, &code) in c.iter().enumerate() {
                    let bit = 4 * i + k % 4;
                    h[(k / 4) * 8 + bit / 8] |= ((code >> 4) & 1) << (bit % 8);
                }
            } else if ty == GgmlType::Q6K {
                let h = &mut high[b * 128..(b + 1) * 128];
                for (k, &code) in c.iter().enumerate() {
                    let (chunk, e) = (k / 4, k % 4);
                    let (q, kk) = (chunk / 4, chunk % 4);
                    h[q * 64 + 4 * i + e] |= ((code >> 4) & 3) << (2 * kk);
                }
            }
        }
    }
}

/// One decoded (16 rows x 32 columns) tile in canonical form; see `portable`.
#[derive(Clone, Copy)]
pub(crate) struct Tile {
    pub codes: [[u8; 32]; GROUP],
    /// Per-row weight scale of the block: d (legacy, Q6_K) or d·sc (Q4_K).
    pub scale: [f32; GROUP],
    /// Per-row additive term: m (Q4_1/Q5_1), −dmin·mq (Q4_K), else 0.
    pub min: [f32; GROUP],
    /// Integer sub-block scales: Q4_K (sc, mq); Q6_K (first 16 columns,
    /// second 16 columns).
    pub sub: [[i32; 2]; GROUP],
    /// K-quants: the super-block's d and (Q4_K) dmin.
    pub dk: [[f32; 2]; GROUP],
}

impl Default for Tile {
    fn default() -> Self {
        Tile {
            codes: [[0; 32]; GROUP],
            scale: [0.0; GROUP],
            min: [0.0; GROUP],
            sub: [[0; 2]; GROUP],
            dk: [[0.0; 2]; GROUP],
        }
    }
}

fn f16_get(s: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([s[2 * i], s[2 * i + 1]]).to_f32()
}

/// Decode block `b` of a group (quantized formats only).
#[cfg(test)]
pub(crate) fn decode_tile(ty: GgmlType, p: &Planes, group: &[u8], b: usize, t: &mut Tile) {
    for i in 0..GROUP {
        decode_tile_row(ty, p, group, b, i, t);
    }
}

/// Decode row `i` of block `b` of a group into row `i` of `t` (quantized formats only):
/// one embedding lookup needs one row, not the tile's sixteen.
pub(crate) fn decode_tile_row(
    ty: GgmlType,
    p: &Planes,
    group: &[u8],
    b: usize,
    i: usize,
    t: &mut Tile,
) {
    let codes = &group[..p.codes];
    let high = &group[p.codes..p.codes + p.high];
    let scales = &group[p.codes + p.high..];
    for k in 0..32 {
        let (chunk, e) = (k / 4, k % 4);
        let mut c = if ty == GgmlType::Q8_0 {
            codes[b * 512 + chunk * 64 + 4 * i + e]
        } else {
            let byte = codes[b * 256 + (chunk % 4) * 64 + 4 * i + e];
            if chunk < 4 {
                byte & 0xF
            } else {
                byte >> 4
            }
        };
        if matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1) {
            let bit = 4 * i + e;
            c |= ((high[b * 64 + chunk * 8 + bit / 8] >> (bit % 8)) & 1) << 4;
        } else if ty == GgmlType::Q6K {
            let byte = high[b * 128 + (chunk / 4) * 64 + 4 * i + e];
            c |= ((byte >> (2 * (chunk % 4))) & 3) << 4;
        }
        t.codes[i][k] = c;
    }
    decode_row_scales(ty, scales, b, i, t);
}

/// Row `i`'s scales of block `b` (scale, min, sub-block scales, super-block scales) into
/// `t`, from a group's scale plane `scales`; the codes are left alone.
#[inline]
pub(crate) fn decode_row_scales(ty: GgmlType, scales: &[u8], b: usize, i: usize, t: &mut Tile) {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => {
            t.scale[i] = f16_get(&scales[b * 32..], i);
            t.min[i] = 0.0;
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            t.scale[i] = f16_get(&scales[b * 64..], i);
            t.min[i] = f16_get(&scales[b * 64 + 32..], i);
        }
        GgmlType::Q4K => {
            let s = &scales[(b / 8) * 320..];
            let j = b % 8;
            let (sc, mq) = (
                s[Q4K_SC + 16 * j + i],
                s[Q4K_MQ + 32 * (j / 2) + 2 * i + j % 2],
            );
            let (d, dmin) = (f16_get(s, i), f16_get(&s[32..], i));
            t.scale[i] = d * sc as f32;
            t.min[i] = -(dmin * mq as f32);
            t.sub[i] = [sc as i32, mq as i32];
            t.dk[i] = [d, dmin];
        }
        GgmlType::Q6K => {
            let s = &scales[(b / 8) * 320..];
            let j = b % 8;
            t.scale[i] = f16_get(s, i);
            t.min[i] = 0.0;
            t.sub[i] = [
                s[Q6K_SUB + 32 * j + 2 * i] as i8 as i32,
                s[Q6K_SUB + 32 * j + 2 * i + 1] as i8 as i32,
            ];
            t.dk[i] = [t.scale[i], 0.0];
        }
        _ => unreachable!(),
    }
}

/// Dequantize row `i` of a decoded tile with ggml's float operations.
pub(crate) fn dequantize_tile_row(ty: GgmlType, t: &Tile, i: usize, y: &mut [f32]) {
    let (d, m) = (t.scale[i], t.min[i]);
    let z = zero_point(ty);
    for (k, y) in y.iter_mut().enumerate() {
        let c = t.codes[i][k] as i32;
        *y = match ty {
            GgmlType::Q4_1 | GgmlType::Q5_1 => c as f32 * d + m,
            GgmlType::Q4K => d * c as f32 + m,
            GgmlType::Q6K => d * t.sub[i][k / 16] as f32 * (c - z) as f32,
            _ => (c - z) as f32 * d,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::ggml::QUANT_TYPES;

    /// The direct packers write exactly the bytes of the decode-and-scatter reference, for
    /// every format they take, all 16 row slots and a partial group, from random bytes.
    #[test]
    fn direct_packing_equals_decoded_packing() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut byte = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        };
        let mut direct_types = 0;
        for ty in QUANT_TYPES {
            let cols = 512;
            let p = Planes::new(ty, cols);
            let rb = ty.row_bytes(cols).unwrap();
            for n_rows in [GROUP, 5] {
                let rows: Vec<Vec<u8>> = (0..n_rows)
                    .map(|_| (0..rb).map(|_| byte()).collect())
                    .collect();
                let (mut want, mut got) = (vec![0u8; p.group_bytes()], vec![0u8; p.group_bytes()]);
                let mut direct = true;
                for (i, row) in rows.iter().enumerate() {
                    let (c, rest) = want.split_at_mut(p.codes);
                    let (h, s) = rest.split_at_mut(p.high);
                    pack_row_decoded(ty, i, row, c, h, s);
                    let (c, rest) = got.split_at_mut(p.codes);
                    let (h, s) = rest.split_at_mut(p.high);
                    direct &= pack_row_direct(ty, i, row, c, h, s);
                }
                if direct {
                    assert!(want == got, "{ty:?} with {n_rows} rows");
                    direct_types += 1;
                }
            }
        }
        // Q4_0, Q5_0, Q8_0, Q4_K, Q6_K, each full and partial.
        assert_eq!(direct_types, 10);
    }
}
