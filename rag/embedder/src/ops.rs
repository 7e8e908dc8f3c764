//! Element-wise and row operations of the encoder: layer norm, GELU, attention, pooling.
//!
//! All are safe Rust written so that LLVM vectorises them (fixed-width lane accumulators,
//! branch-free `exp`/`erf`); reductions use a fixed lane order so results are deterministic.

const LANES: usize = 8;

/// `Σ a[i]·b[i]` with 8 lane accumulators (vectorisable, fixed order).
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    sum_lanes(&acc) + tail
}

fn sum(a: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = a.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for l in 0..LANES {
            acc[l] += c[l];
        }
    }
    sum_lanes(&acc) + tail
}

fn sum_lanes(acc: &[f32; LANES]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// `e^x` to ~2 ulp for x in [-87, 88] without branches so loops over slices vectorise.
/// Below -87.3 it returns ~1e-38 instead of underflowing to 0, above 88.3 it saturates.
#[inline(always)]
pub fn exp_approx(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits.
    const SHIFTER: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.3);
    let t = x * LOG2E + SHIFTER;
    let n = t - SHIFTER;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // Taylor series to r^7: |r| <= ln2/2 keeps the truncation error below 1e-8 relative.
    let p = 1.0 / 5040.0;
    let p = p * r + 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    let ni = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
    p * f32::from_bits(((ni + 127) << 23) as u32)
}

/// `erf(x)` with absolute error below 5e-7 (Abramowitz & Stegun 7.1.26 in f32), branch-free.
#[inline(always)]
pub fn erf_approx(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152,
        1.061_405_4,
    ];
    let ax = x.abs();
    let t = 1.0 / (1.0 + P * ax);
    let poly = ((((A[4] * t + A[3]) * t + A[2]) * t + A[1]) * t + A[0]) * t;
    (1.0 - poly * exp_approx(-ax * ax)).copysign(x)
}

/// Exact (erf-based) GELU in place, as BERT's `hidden_act = "gelu"`.
pub(crate) fn gelu_in_place(x: &mut [f32]) {
    const INV_SQRT2: f32 = std::f32::consts::FRAC_1_SQRT_2;
    for v in x {
        *v = 0.5 * *v * (1.0 + erf_approx(*v * INV_SQRT2));
    }
}

/// `x = LayerNorm(x + residual)` on one row.
pub(crate) fn add_layer_norm(
    x: &mut [f32],
    residual: Option<&[f32]>,
    w: &[f32],
    b: &[f32],
    eps: f32,
) {
    if let Some(res) = residual {
        for (v, r) in x.iter_mut().zip(res) {
            *v += r;
        }
    }
    let n = x.len() as f32;
    let mean = sum(x) / n;
    let mut sq = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail: f32 = chunks
        .remainder()
        .iter()
        .map(|v| (v - mean) * (v - mean))
        .sum();
    for c in chunks {
        for l in 0..LANES {
            let d = c[l] - mean;
            sq[l] += d * d;
        }
    }
    let var = (sum_lanes(&sq) + tail) / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((v, w), b) in x.iter_mut().zip(w).zip(b) {
        *v = (*v - mean) * inv * w + b;
    }
}

/// Test reference for the encoder's GEMM attention.
/// Keys of one sequence, transposed per head so a query's scores are a sum of axpys over
/// the keys (vectorises without horizontal reductions).
#[cfg(test)]
pub(crate) struct KeysT<'a> {
    /// `[hidden][stride]`: element `(h·head_dim + d, j)` is dimension `d` of head `h` of key `j`.
    pub data: &'a [f32],
    pub stride: usize,
    /// Real (unmasked) tokens of the sequence: the attention mask.
    pub len: usize,
}

/// Scaled dot-product attention for one query row of one sequence, all heads.
///
/// `values` holds the sequence's value rows at `v_stride` floats apart; only the first
/// `keys.len` keys and values are read, so padding never enters the scores. `scores` needs
/// `keys.len` slots.
#[cfg(test)]
pub(crate) fn attend_row(
    q: &[f32],
    keys: &KeysT,
    values: &[f32],
    v_stride: usize,
    head_dim: usize,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let scale = 1.0 / (head_dim as f32).sqrt();
    let len = keys.len;
    let scores = &mut scores[..len];
    for (h, (qh, oh)) in q
        .chunks_exact(head_dim)
        .zip(out.chunks_exact_mut(head_dim))
        .enumerate()
    {
        // Four key dimensions per pass over the scores (fixed order, fewer loads/stores).
        scores.fill(0.0);
        let key_row = |d: usize| &keys.data[(h * head_dim + d) * keys.stride..][..len];
        let mut d = 0;
        while d + 4 <= head_dim {
            let (k0, k1, k2, k3) = (key_row(d), key_row(d + 1), key_row(d + 2), key_row(d + 3));
            let (q0, q1, q2, q3) = (qh[d], qh[d + 1], qh[d + 2], qh[d + 3]);
            for j in 0..len {
                scores[j] += q0 * k0[j] + q1 * k1[j] + q2 * k2[j] + q3 * k3[j];
            }
            d += 4;
        }
        for (d, &qd) in qh.iter().enumerate().skip(d) {
            for (s, k) in scores.iter_mut().zip(key_row(d)) {
                *s += qd * k;
            }
        }
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        for s in scores.iter_mut() {
            *s = exp_approx((*s - max) * scale);
        }
        let inv = 1.0 / sum(scores);
        oh.fill(0.0);
        let value = |j: usize| &values[j * v_stride + h * head_dim..][..head_dim];
        let mut j = 0;
        while j + 4 <= len {
            let (v0, v1, v2, v3) = (value(j), value(j + 1), value(j + 2), value(j + 3));
            let (p0, p1, p2, p3) = (scores[j], scores[j + 1], scores[j + 2], scores[j + 3]);
            for i in 0..head_dim {
                oh[i] += p0 * v0[i] + p1 * v1[i] + p2 * v2[i] + p3 * v3[i];
            }
            j += 4;
        }
        for (j, &p) in scores.iter().enumerate().skip(j) {
            for (o, v) in oh.iter_mut().zip(value(j)) {
                *o += p * v;
            }
        }
        for o in oh.iter_mut() {
            *o *= inv;
        }
    }
}

/// Mean of `rows` (`[len, dim]`) then L2 normalisation (norm floored at 1e-12 like
/// sentence-transformers' `Normalize`).
pub(crate) fn mean_pool_normalize(rows: &[f32], dim: usize, out: &mut [f32]) {
    out.fill(0.0);
    let len = rows.len() / dim;
    for row in rows.chunks_exact(dim) {
        for (o, v) in out.iter_mut().zip(row) {
            *o += v;
        }
    }
    let inv_len = 1.0 / len.max(1) as f32;
    for o in out.iter_mut() {
        *o *= inv_len;
    }
    let norm = dot(out, out).sqrt().max(1e-12);
    for o in out.iter_mut() {
        *o /= norm;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn erf_f64(x: f64) -> f64 {
        // Maclaurin series, accurate in f64 for |x| <= 3; erfc tail is < 3e-5 beyond.
        if x.abs() > 5.0 {
            return x.signum();
        }
        let mut term = x;
        let mut s = x;
        for n in 1..200 {
            term *= -x * x / n as f64;
            s += term / (2 * n + 1) as f64;
        }
        s * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn exp_matches_std() {
        let mut worst = 0.0f64;
        for i in -87_000..=88_000 {
            let x = i as f32 * 1e-3;
            let want = (x as f64).exp();
            let got = exp_approx(x) as f64;
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert!(exp_approx(-1e30) < 1e-37);
        assert!(exp_approx(1e30).is_finite());
        assert_eq!(exp_approx(0.0), 1.0);
    }

    #[test]
    fn erf_matches_series() {
        let mut worst = 0.0f64;
        for i in -5000..=5000 {
            let x = i as f32 * 1e-3;
            worst = worst.max((erf_approx(x) as f64 - erf_f64(x as f64)).abs());
        }
        assert!(worst < 5e-7, "worst abs error {worst}");
        assert_eq!(erf_approx(100.0), 1.0);
        assert_eq!(erf_approx(-100.0), -1.0);
    }

    #[test]
    fn layer_norm_normalises() {
        let mut x: Vec<f32> = (0..37).map(|i| (i * i) as f32 * 0.1 - 3.0).collect();
        let w = vec![1.0; 37];
        let b = vec![0.0; 37];
        add_layer_norm(&mut x, None, &w, &b, 1e-12);
        let mean: f32 = x.iter().sum::<f32>() / 37.0;
        let var: f32 = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / 37.0;
        assert!(
            mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-4,
            "{mean} {var}"
        );
    }

    #[test]
    fn attention_is_softmax_weighted_values() {
        // Two heads of width 2, two real keys and one padded slot (stride 3).
        let q = [1.0f32, 0.0, 0.0, 2.0];
        let keys = [[1.0f32, 0.0, 0.5, 0.0], [0.0, 1.0, 0.0, 1.0]];
        let vals = [[1.0f32, 2.0, 5.0, 6.0], [3.0, 4.0, 7.0, 8.0]];
        let mut kt = vec![f32::NAN; 4 * 3];
        for (j, k) in keys.iter().enumerate() {
            for (c, &x) in k.iter().enumerate() {
                kt[c * 3 + j] = x;
            }
        }
        let v: Vec<f32> = vals.iter().flatten().copied().collect();
        let keys_t = KeysT {
            data: &kt,
            stride: 3,
            len: 2,
        };
        let mut scores = [0.0; 3];
        let mut out = [0.0; 4];
        attend_row(&q, &keys_t, &v, 4, 2, &mut scores, &mut out);
        let mut want = [0.0f32; 4];
        for h in 0..2 {
            let s: Vec<f32> = keys
                .iter()
                .map(|k| (q[2 * h] * k[2 * h] + q[2 * h + 1] * k[2 * h + 1]) / 2f32.sqrt())
                .collect();
            let e: Vec<f32> = s.iter().map(|x| x.exp()).collect();
            let z: f32 = e.iter().sum();
            for d in 0..2 {
                want[2 * h + d] = (e[0] * vals[0][2 * h + d] + e[1] * vals[1][2 * h + d]) / z;
            }
        }
        for (o, w) in out.iter().zip(want) {
            assert!((o - w).abs() < 1e-6, "{out:?} {want:?}");
        }
    }

    #[test]
    fn pooling_normalises_the_mean() {
        let rows = [1.0f32, 0.0, 3.0, 4.0];
        let mut out = [0.0; 2];
        mean_pool_normalize(&rows, 2, &mut out);
        let (mx, my) = (2.0f32, 2.0f32);
        let n = (mx * mx + my * my).sqrt();
        assert!((out[0] - mx / n).abs() < 1e-7 && (out[1] - my / n).abs() < 1e-7);
    }
}
