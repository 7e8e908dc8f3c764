//! Portable kernels: the canonical computation every ISA reproduces exactly.
//!
//! For a row r and a token t (quantized activations a, block scale da, code sum
//! S, first-16 sum S_lo, dsum = da·S), over blocks b in column order, starting
//! from acc = 0.0 (f32):
//!
//! * legacy formats, per block: isum = Σ_k c_k·a_k − zero·S (exact), then
//!   acc = fma(f32(isum), scale_r·da, acc), and for Q4_1/Q5_1 also
//!   acc = fma(min_r, dsum, acc).
//! * K-quants (Q4_K/Q6_K; one activation scale da per 256 columns), per
//!   super-block of 8 blocks j, exact integer sums over the whole super-block:
//!   Q4_K: ISUM = Σ_j sc_j·Σ_k c_k·a_k and MSUM = Σ_j mq_j·S_j;
//!   Q6_K: ISUM = Σ_j lo_j·(Σ_{k<16} c_k·a_k − 32·S_lo) + hi_j·(Σ_{k≥16} c_k·a_k − 32·(S − S_lo));
//!   then acc = fma(f32(ISUM), d_r·da, acc), and for Q4_K also
//!   acc = fma(f32(MSUM), −(dmin_r·da), acc). (|ISUM| < 2^31 for every input:
//!   Q4_K ≤ 8·63·32·15·127, Q6_K ≤ 16·128·16·32·127.)
//!
//! Float weights (F32/F16) skip activation quantization:
//! acc = fma(w_rk, x_tk, acc) for k in order.

use super::act::QuantActs;
use super::ggml::QUANT_TYPES;
#[cfg(test)]
use super::layout::decode_tile;
use super::layout::{decode_row_scales, zero_point, Planes, Tile, GROUP};
use super::matmul::kernel_io::{Kernel, Output};
use super::GgmlType;
use half::f16;
use std::mem::MaybeUninit;

/// Tokens whose accumulators are live at once.
pub(crate) const TCHUNK: usize = 64;

pub(crate) fn has_min(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K)
}

/// `buf` set to `v` everywhere and returned as initialised. The kernels keep
/// `TCHUNK` accumulators but a call uses `min(n_tokens, TCHUNK)` of them: only
/// those are written (a `[v; TCHUNK]` array was a 4-8 KB `memset` per call).
#[inline(always)]
pub(crate) fn filled<T: Copy>(buf: &mut [MaybeUninit<T>], v: T) -> &mut [T] {
    for b in buf.iter_mut() {
        b.write(v);
    }
    // SAFETY: every element was just initialised, and `MaybeUninit<T>` has the
    // layout of `T`.
    unsafe { &mut *(buf as *mut [MaybeUninit<T>] as *mut [T]) }
}

/// Compute groups `g0..g1` for all tokens, writing them through `out`.
///
/// # Safety
/// `out` is valid for `k.n_tokens` tokens and groups `g0..g1`, and nobody else
/// uses those parts of it during the call ([`Output::put`]).
pub(crate) unsafe fn run(
    k: &Kernel,
    acts: &QuantActs,
    x: &[f32],
    g0: usize,
    g1: usize,
    out: &Output,
) {
    // SAFETY: the caller's contract.
    unsafe {
        match k.ty {
            GgmlType::F32 | GgmlType::F16 => run_float(k, x, g0, g1, out),
            GgmlType::Q4_0 => run_quant::<0>(k, acts, g0, g1, out),
            GgmlType::Q4_1 => run_quant::<1>(k, acts, g0, g1, out),
            GgmlType::Q5_0 => run_quant::<2>(k, acts, g0, g1, out),
            GgmlType::Q5_1 => run_quant::<3>(k, acts, g0, g1, out),
            GgmlType::Q8_0 => run_quant::<4>(k, acts, g0, g1, out),
            GgmlType::Q4K => run_quant::<5>(k, acts, g0, g1, out),
            GgmlType::Q6K => run_quant::<6>(k, acts, g0, g1, out),
            _ => unreachable!("{} is not a kernel type (QMatrix::from_ggml checks)", k.ty),
        }
    }
}

/// Byte `t` of entry `m` is `16` where bit `t` of `m` is set: a Q5 high-bit mask byte
/// spread over the eight codes it covers.
const SPREAD16: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut m = 0;
    while m < 256 {
        let mut b = 0;
        while b < 8 {
            if m >> b & 1 == 1 {
                t[m] |= 16 << (8 * b);
            }
            b += 1;
        }
        m += 1;
    }
    t
};

const NIBBLES: u64 = 0x0F0F_0F0F_0F0F_0F0F;

fn word(s: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&s[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Block `b` of a group's codes in the kernels' interleaved order (`layout`): chunk `c`
/// holds columns `4c..4c+4` of the 16 rows, row `i`'s four at bytes `4i..4i+4`. Decoded
/// eight codes at a time in 64-bit words (no per-code branches or bit loops).
fn decode_chunks(ty: GgmlType, p: &Planes, group: &[u8], b: usize) -> [[u8; 64]; 8] {
    let codes = &group[..p.codes];
    let high = &group[p.codes..p.codes + p.high];
    let mut out = [[0u8; 64]; 8];
    for (c, chunk) in out.iter_mut().enumerate() {
        for w in 0..8 {
            let mut v = if ty == GgmlType::Q8_0 {
                word(codes, b * 512 + c * 64 + 8 * w)
            } else {
                let line = word(codes, b * 256 + (c % 4) * 64 + 8 * w);
                if c < 4 {
                    line & NIBBLES
                } else {
                    (line >> 4) & NIBBLES
                }
            };
            match ty {
                GgmlType::Q5_0 | GgmlType::Q5_1 => v |= SPREAD16[high[b * 64 + c * 8 + w] as usize],
                GgmlType::Q6K => {
                    let h = word(high, b * 128 + (c / 4) * 64 + 8 * w);
                    v |= ((h >> (2 * (c % 4))) & 0x0303_0303_0303_0303) << 4;
                }
                _ => {}
            }
            chunk[8 * w..8 * w + 8].copy_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// Row `i`'s 32 codes of a block from its interleaved chunks: columns `4c..4c+4` are
/// bytes `4i..4i+4` of chunk `c`.
#[inline(always)]
fn rows_of(chunks: &[[u8; 64]; 8]) -> [[u8; 32]; GROUP] {
    let mut rows = [[0u8; 32]; GROUP];
    for (i, row) in rows.iter_mut().enumerate() {
        for (c, chunk) in chunks.iter().enumerate() {
            row[4 * c..4 * c + 4].copy_from_slice(&chunk[4 * i..4 * i + 4]);
        }
    }
    rows
}

/// Every row's two half-block dot products `Σ code[k]·a[k]` (columns 0-15 into `lo`,
/// 16-31 into `hi`; exact integer sums). Not inlined: on its own the compiler vectorises
/// the 16-column reductions (inlined into the token loop it kept them scalar).
#[inline(never)]
fn block_dots(rows: &[[u8; 32]; GROUP], a: &[i8], lo: &mut [i32; GROUP], hi: &mut [i32; GROUP]) {
    let a: &[i8; 32] = a.try_into().expect("a block of 32 activations");
    for ((row, lo), hi) in rows.iter().zip(lo.iter_mut()).zip(hi.iter_mut()) {
        // Both operands fit an i16 (codes <= 255): the widened-i16 product sum is the
        // shape that maps onto multiply-add-pairs instructions.
        let dot = |r: std::ops::Range<usize>| -> i32 {
            r.map(|k| (row[k] as i16 as i32) * (a[k] as i16 as i32))
                .sum()
        };
        *lo = dot(0..16);
        *hi = dot(16..32);
    }
}

/// The portable kernel for format `QUANT_TYPES[F]`: [`run_quant_canonical`]'s arithmetic
/// (same integer sums, same float steps in the same order, so the same bits), organised
/// for speed: each block's codes decoded once for all tokens by 64-bit words into a
/// row-major copy, the dot products in a separately compiled vectorisable function, one
/// loop per format (the 0.5B forward 5x the canonical loop at one token, 2x at 64, x86-64
/// baseline code; benchmarks/runs/kernels-worklog.md#item-86).
///
/// # Safety
/// As [`run`].
unsafe fn run_quant<const F: usize>(
    k: &Kernel,
    acts: &QuantActs,
    g0: usize,
    g1: usize,
    out: &Output,
) {
    // The format as a constant (`QUANT_TYPES[F]`, the matrix's type): each format's
    // loop is compiled on its own, with no per-row format branches.
    let ty = QUANT_TYPES[F];
    debug_assert_eq!(ty, k.ty);
    let nb = k.cols / 32;
    let z = zero_point(ty);
    let mut tile = Tile::default();
    let mut acc = [[0f32; GROUP]; TCHUNK];
    let mut isum = [[0i32; GROUP]; TCHUNK];
    let mut msum = [[0i32; GROUP]; TCHUNK];
    for g in g0..g1 {
        let group = k.group(g);
        let scales = &group[k.planes.codes + k.planes.high..];
        for t0 in (0..k.n_tokens).step_by(TCHUNK) {
            let nt = TCHUNK.min(k.n_tokens - t0);
            acc[..nt].iter_mut().for_each(|a| *a = [0.0; GROUP]);
            for b in 0..nb {
                let rows = rows_of(&decode_chunks(ty, &k.planes, group, b));
                for i in 0..GROUP {
                    decode_row_scales(ty, scales, b, i, &mut tile);
                }
                for dt in 0..nt {
                    let blk = (t0 + dt) * nb + b;
                    let a = &acts.q[blk * 32..blk * 32 + 32];
                    let (mut lo, mut hi) = ([0i32; GROUP], [0i32; GROUP]);
                    block_dots(&rows, a, &mut lo, &mut hi);
                    let (da, s, s_lo, dsum) =
                        (acts.d[blk], acts.sum[blk], acts.sum_lo[blk], acts.dsum[blk]);
                    if matches!(ty, GgmlType::Q4K | GgmlType::Q6K) && b % 8 == 0 {
                        // A super-block starts its integer sums.
                        isum[dt] = [0; GROUP];
                        msum[dt] = [0; GROUP];
                    }
                    for i in 0..GROUP {
                        let (dlo, dhi) = (lo[i], hi[i]);
                        let [s0, s1] = tile.sub[i];
                        match ty {
                            GgmlType::Q4K => {
                                isum[dt][i] += s0 * (dlo + dhi);
                                msum[dt][i] += s1 * s;
                            }
                            GgmlType::Q6K => {
                                isum[dt][i] +=
                                    s0 * (dlo - 32 * s_lo) + s1 * (dhi - 32 * (s - s_lo));
                            }
                            _ => {
                                let v = dlo + dhi - z * s;
                                let acc = &mut acc[dt][i];
                                *acc = (v as f32).mul_add(tile.scale[i] * da, *acc);
                                if has_min(ty) {
                                    *acc = tile.min[i].mul_add(dsum, *acc);
                                }
                            }
                        }
                    }
                }
                if matches!(ty, GgmlType::Q4K | GgmlType::Q6K) && b % 8 == 7 {
                    for dt in 0..nt {
                        // Q8K activations: one scale for the 8 blocks.
                        let da = acts.d[(t0 + dt) * nb + b];
                        for i in 0..GROUP {
                            let [d, dmin] = tile.dk[i];
                            let acc = &mut acc[dt][i];
                            *acc = (isum[dt][i] as f32).mul_add(d * da, *acc);
                            if ty == GgmlType::Q4K {
                                *acc = (msum[dt][i] as f32).mul_add(-(dmin * da), *acc);
                            }
                        }
                    }
                }
            }
            for (dt, acc) in acc[..nt].iter().enumerate() {
                // SAFETY: token t0 + dt and group g of this call (the contract).
                unsafe { out.put(t0 + dt, g, acc) };
            }
        }
    }
}

/// [`run`] for the quantized formats computed the plainest way: the canonical order
/// written out row by row from a decoded [`Tile`], the specification [`run_quant`] and
/// every SIMD kernel reproduce bit for bit (slow; kept as the tests' oracle).
///
/// # Safety
/// As [`run`].
#[cfg(test)]
pub(crate) unsafe fn run_quant_canonical(
    k: &Kernel,
    acts: &QuantActs,
    g0: usize,
    g1: usize,
    out: &Output,
) {
    let nb = k.cols / 32;
    let z = zero_point(k.ty);
    let kq = matches!(k.ty, GgmlType::Q4K | GgmlType::Q6K);
    let mut tile = Tile::default();
    let mut acc = [[0f32; GROUP]; TCHUNK];
    // K-quants: integer sums of the current super-block per (token, row).
    let mut isum = [[0i32; GROUP]; TCHUNK];
    let mut msum = [[0i32; GROUP]; TCHUNK];
    for g in g0..g1 {
        let group = k.group(g);
        for t0 in (0..k.n_tokens).step_by(TCHUNK) {
            let nt = TCHUNK.min(k.n_tokens - t0);
            acc[..nt].iter_mut().for_each(|a| *a = [0.0; GROUP]);
            for b in 0..nb {
                decode_tile(k.ty, &k.planes, group, b, &mut tile);
                if kq && b % 8 == 0 {
                    isum[..nt].iter_mut().for_each(|a| *a = [0; GROUP]);
                    msum[..nt].iter_mut().for_each(|a| *a = [0; GROUP]);
                }
                for dt in 0..nt {
                    let blk = (t0 + dt) * nb + b;
                    let a = &acts.q[blk * 32..blk * 32 + 32];
                    let (da, s, s_lo, dsum) =
                        (acts.d[blk], acts.sum[blk], acts.sum_lo[blk], acts.dsum[blk]);
                    for i in 0..GROUP {
                        let c = &tile.codes[i];
                        let dot = |r: std::ops::Range<usize>| -> i32 {
                            r.map(|kk| c[kk] as i32 * a[kk] as i32).sum()
                        };
                        let [s0, s1] = tile.sub[i];
                        match k.ty {
                            GgmlType::Q4K => {
                                isum[dt][i] += s0 * dot(0..32);
                                msum[dt][i] += s1 * s;
                            }
                            GgmlType::Q6K => {
                                isum[dt][i] += s0 * (dot(0..16) - 32 * s_lo)
                                    + s1 * (dot(16..32) - 32 * (s - s_lo));
                            }
                            _ => {
                                let v = dot(0..32) - z * s;
                                let acc = &mut acc[dt][i];
                                *acc = (v as f32).mul_add(tile.scale[i] * da, *acc);
                                if has_min(k.ty) {
                                    *acc = tile.min[i].mul_add(dsum, *acc);
                                }
                            }
                        }
                    }
                }
                if kq && b % 8 == 7 {
                    for dt in 0..nt {
                        // Q8K activations: one scale for the 8 blocks.
                        let da = acts.d[(t0 + dt) * nb + b];
                        for i in 0..GROUP {
                            let [d, dmin] = tile.dk[i];
                            let acc = &mut acc[dt][i];
                            *acc = (isum[dt][i] as f32).mul_add(d * da, *acc);
                            if k.ty == GgmlType::Q4K {
                                *acc = (msum[dt][i] as f32).mul_add(-(dmin * da), *acc);
                            }
                        }
                    }
                }
            }
            for (dt, acc) in acc[..nt].iter().enumerate() {
                // SAFETY: token t0 + dt and group g of this call (the contract).
                unsafe { out.put(t0 + dt, g, acc) };
            }
        }
    }
}

/// # Safety
/// As [`run`].
unsafe fn run_float(k: &Kernel, x: &[f32], g0: usize, g1: usize, out: &Output) {
    let es = if k.ty == GgmlType::F32 { 4 } else { 2 };
    for g in g0..g1 {
        let group = k.group(g);
        for t in 0..k.n_tokens {
            let xt = &x[t * k.cols..(t + 1) * k.cols];
            let mut acc = [0f32; GROUP];
            for (kk, xv) in xt.iter().enumerate() {
                for (i, acc) in acc.iter_mut().enumerate() {
                    let o = (kk * GROUP + i) * es;
                    let w = if es == 4 {
                        f32::from_le_bytes([group[o], group[o + 1], group[o + 2], group[o + 3]])
                    } else {
                        f16::from_le_bytes([group[o], group[o + 1]]).to_f32()
                    };
                    *acc = w.mul_add(*xv, *acc);
                }
            }
            // SAFETY: token t and group g of this call (the contract).
            unsafe { out.put(t, g, &acc) };
        }
    }
}
