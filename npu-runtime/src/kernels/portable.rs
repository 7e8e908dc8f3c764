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
use super::layout::{decode_tile, zero_point, Tile, GROUP};
use super::matmul::{Kernel, Output};
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
            _ => run_quant(k, acts, g0, g1, out),
        }
    }
}

/// # Safety
/// As [`run`].
unsafe fn run_quant(k: &Kernel, acts: &QuantActs, g0: usize, g1: usize, out: &Output) {
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

/// Running per-lane maximum for the argmax LM head: where `acc[i] > best[i]`
/// (false for NaN), `best[i] = acc[i]` and `group[i] = g`. Visiting groups in
/// ascending order keeps each lane's first (lowest-row) maximum.
pub(crate) fn lane_best(
    best: &mut [f32; GROUP],
    group: &mut [u32; GROUP],
    acc: &[f32; GROUP],
    g: u32,
) {
    for i in 0..GROUP {
        if acc[i] > best[i] {
            best[i] = acc[i];
            group[i] = g;
        }
    }
}
