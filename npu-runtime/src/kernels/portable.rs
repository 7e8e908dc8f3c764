//! Portable kernels: the canonical computation every ISA reproduces exactly.
//!
//! For a row r and a token t (quantized activations a, block scale da, code sum
//! S, first-16 sum S_lo, dsum = da·S), over blocks b in column order, starting
//! from acc = 0.0 (f32):
//!
//! * integer part (exact): isum = Σ_k c_k·a_k − zero·S; for Q6_K
//!   isum = sub_lo·(Σ_{k<16} c_k·a_k − 32·S_lo) + sub_hi·(Σ_{k≥16} c_k·a_k − 32·(S − S_lo))
//! * acc = fma(f32(isum), scale_r·da, acc)
//! * Q4_1/Q5_1/Q4_K only: acc = fma(min_r, dsum, acc)
//!
//! Float weights (F32/F16) skip activation quantization:
//! acc = fma(w_rk, x_tk, acc) for k in order.

use super::act::QuantActs;
use super::layout::{decode_tile, zero_point, Tile, GROUP};
use super::matmul::Kernel;
use super::GgmlType;
use half::f16;

/// Tokens whose accumulators are live at once.
pub(crate) const TCHUNK: usize = 64;

pub(crate) fn has_min(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K)
}

/// Compute groups `g0..g1` for all tokens; `write(t, g, &acc)` stores results.
pub(crate) fn run(
    k: &Kernel,
    acts: &QuantActs,
    x: &[f32],
    g0: usize,
    g1: usize,
    write: &dyn Fn(usize, usize, &[f32; GROUP]),
) {
    match k.ty {
        GgmlType::F32 | GgmlType::F16 => run_float(k, x, g0, g1, write),
        _ => run_quant(k, acts, g0, g1, write),
    }
}

fn run_quant(
    k: &Kernel,
    acts: &QuantActs,
    g0: usize,
    g1: usize,
    write: &dyn Fn(usize, usize, &[f32; GROUP]),
) {
    let nb = k.cols / 32;
    let z = zero_point(k.ty);
    let mut tile = Tile::default();
    let mut acc = [[0f32; GROUP]; TCHUNK];
    for g in g0..g1 {
        let group = k.group(g);
        for t0 in (0..k.n_tokens).step_by(TCHUNK) {
            let nt = TCHUNK.min(k.n_tokens - t0);
            acc[..nt].iter_mut().for_each(|a| *a = [0.0; GROUP]);
            for b in 0..nb {
                decode_tile(k.ty, &k.planes, group, b, &mut tile);
                for (dt, acc) in acc[..nt].iter_mut().enumerate() {
                    let blk = (t0 + dt) * nb + b;
                    let a = &acts.q[blk * 32..blk * 32 + 32];
                    let (da, s, s_lo, dsum) =
                        (acts.d[blk], acts.sum[blk], acts.sum_lo[blk], acts.dsum[blk]);
                    for (i, acc) in acc.iter_mut().enumerate() {
                        let c = &tile.codes[i];
                        let dot = |r: std::ops::Range<usize>| -> i32 {
                            r.map(|kk| c[kk] as i32 * a[kk] as i32).sum()
                        };
                        let isum = if k.ty == GgmlType::Q6K {
                            tile.sub[i][0] * (dot(0..16) - 32 * s_lo)
                                + tile.sub[i][1] * (dot(16..32) - 32 * (s - s_lo))
                        } else {
                            dot(0..32) - z * s
                        };
                        *acc = (isum as f32).mul_add(tile.scale[i] * da, *acc);
                        if has_min(k.ty) {
                            *acc = tile.min[i].mul_add(dsum, *acc);
                        }
                    }
                }
            }
            for (dt, acc) in acc[..nt].iter().enumerate() {
                write(t0 + dt, g, acc);
            }
        }
    }
}

fn run_float(
    k: &Kernel,
    x: &[f32],
    g0: usize,
    g1: usize,
    write: &dyn Fn(usize, usize, &[f32; GROUP]),
) {
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
            write(t, g, &acc);
        }
    }
}
