//! Activation quantization: each token's row is cut into blocks of 32 and each
//! block becomes 32 int8 values with one f32 scale (like ggml's Q8_0, but with
//! an f32 scale), independently of every other token, so a token's quantized
//! activations do not depend on the batch it arrives in.
//!
//! Canonical rule: `d = amax / 127`, `q = round_half_even(x · (1/d))` clamped
//! to ±127 (0 when `d == 0`). Also stored per block: the code sum, the sum of
//! its first 16 codes and `d · sum` (for the formats' zero points and minimums).
//! Non-finite inputs give unspecified (but never unsafe) codes.

/// Quantized activations of up to `max_tokens` rows of up to `max_cols` columns.
pub(crate) struct QuantActs {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub sum: Vec<i32>,
    pub sum_lo: Vec<i32>,
    pub dsum: Vec<f32>,
}

impl QuantActs {
    pub fn new(max_tokens: usize, max_cols: usize) -> Self {
        let nb = max_tokens * max_cols.div_ceil(32);
        QuantActs {
            q: vec![0; nb * 32],
            d: vec![0.0; nb],
            sum: vec![0; nb],
            sum_lo: vec![0; nb],
            dsum: vec![0.0; nb],
        }
    }
}

/// Round to nearest, ties to even, for |v| < 2^22 (exact; matches the
/// hardware conversion under the default rounding mode).
#[inline(always)]
fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    (v + MAGIC) - MAGIC
}

/// Quantize `x` (`n_tokens` rows of `cols`, `cols % 32 == 0`) into `a`, using
/// flat block index `t * cols / 32 + b`.
pub(crate) fn quantize(x: &[f32], cols: usize, a: &mut QuantActs) {
    debug_assert_eq!(cols % 32, 0);
    let nblocks = x.len() / 32;
    for blk in 0..nblocks {
        let xs = &x[blk * 32..blk * 32 + 32];
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q = &mut a.q[blk * 32..blk * 32 + 32];
        let mut sum_lo = 0i32;
        let mut sum = 0i32;
        for (k, (q, v)) in q.iter_mut().zip(xs).enumerate() {
            let c = (round_even(v * id) as i32).clamp(-127, 127);
            *q = c as i8;
            sum += c;
            if k < 16 {
                sum_lo += c;
            }
        }
        a.d[blk] = d;
        a.sum[blk] = sum;
        a.sum_lo[blk] = sum_lo;
        a.dsum[blk] = d * sum as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_even_matches_std() {
        for i in -3000..3000 {
            let v = i as f32 * 0.05;
            assert_eq!(round_even(v), v.round_ties_even(), "{v}");
        }
        assert_eq!(round_even(2.5), 2.0);
        assert_eq!(round_even(-3.5), -4.0);
    }

    #[test]
    fn quantization_error_is_within_half_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.3)
            .collect();
        let mut a = QuantActs::new(1, 64);
        quantize(&x, 64, &mut a);
        for b in 0..2 {
            let d = a.d[b];
            for k in 0..32 {
                let err = (a.q[b * 32 + k] as f32 * d - x[b * 32 + k]).abs();
                assert!(err <= d * 0.5 + 1e-6);
            }
            let s: i32 = a.q[b * 32..b * 32 + 32].iter().map(|&q| q as i32).sum();
            assert_eq!(s, a.sum[b]);
        }
        let zero = vec![0f32; 32];
        quantize(&zero, 32, &mut a);
        assert_eq!(a.d[0], 0.0);
        assert!(a.q[..32].iter().all(|&q| q == 0));
    }
}
