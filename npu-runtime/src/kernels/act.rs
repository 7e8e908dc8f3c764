//! Activation quantization: each token's row is cut into blocks of 32 and each
//! block becomes 32 int8 values with one f32 scale (like ggml's Q8_0, but with
//! an f32 scale), independently of every other token, so a token's quantized
//! activations do not depend on the batch it arrives in.
//!
//! Canonical rule: `d = amax / 127`, `q = round_half_even(x · (1/d))` clamped
//! to ±127 (0 when `d == 0`). Also stored per block: the code sum, the sum of
//! its first 16 codes and `d · sum` (for the formats' zero points and minimums).
//! Non-finite inputs give unspecified (but never unsafe) codes.

use super::pool::ThreadPool;
use super::simd::Isa;

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
/// flat block index `t * cols / 32 + b`, with the best kernel for `isa`.
pub(crate) fn quantize(isa: Isa, x: &[f32], a: &mut QuantActs) {
    let nblocks = x.len() / 32;
    let out = ActsPtr::new(a);
    // SAFETY: the ISA is supported (checked by the caller, `matmul_with_isa`)
    // and blocks 0..nblocks fit in `a` (the scratch was sized for this call).
    unsafe { quantize_blocks(isa, x, out, 0, nblocks) }
}

/// Quantize `x` splitting blocks across the pool (each task owns a range).
pub(crate) fn quantize_parallel(isa: Isa, x: &[f32], a: &mut QuantActs, pool: &ThreadPool) {
    let nblocks = x.len() / 32;
    let n_tasks = if nblocks < 512 {
        1
    } else {
        pool.n_threads().min(nblocks / 256)
    };
    if n_tasks <= 1 {
        return quantize(isa, x, a);
    }
    let out = ActsPtr::new(a);
    pool.parallel_for(n_tasks, &|t| {
        let (b0, b1) = (t * nblocks / n_tasks, (t + 1) * nblocks / n_tasks);
        // SAFETY: as in `quantize`; tasks cover disjoint block ranges, so no
        // two threads write the same element.
        unsafe { quantize_blocks(isa, x, out, b0, b1) }
    });
}

/// Raw pointers into a `QuantActs` so pool tasks can fill disjoint blocks.
#[derive(Clone, Copy)]
pub(crate) struct ActsPtr {
    q: *mut i8,
    d: *mut f32,
    sum: *mut i32,
    sum_lo: *mut i32,
    dsum: *mut f32,
    len: usize,
}
// SAFETY: only used by tasks writing disjoint blocks while the `QuantActs` is
// exclusively borrowed by the caller that created the pointers.
unsafe impl Send for ActsPtr {}
// SAFETY: as above.
unsafe impl Sync for ActsPtr {}

impl ActsPtr {
    fn new(a: &mut QuantActs) -> Self {
        ActsPtr {
            q: a.q.as_mut_ptr(),
            d: a.d.as_mut_ptr(),
            sum: a.sum.as_mut_ptr(),
            sum_lo: a.sum_lo.as_mut_ptr(),
            dsum: a.dsum.as_mut_ptr(),
            len: a.d.len(),
        }
    }
}

/// # Safety
/// `isa` must be supported; `b1 <= out.len`, `x.len() >= 32 * b1`; no other
/// thread may access blocks `b0..b1` of `out` meanwhile.
unsafe fn quantize_blocks(isa: Isa, x: &[f32], out: ActsPtr, b0: usize, b1: usize) {
    assert!(b1 <= out.len && x.len() >= 32 * b1);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni {
        // SAFETY: forwarded from the caller.
        return unsafe { quantize_avx512(x, out, b0, b1) };
    }
    let _ = isa;
    for blk in b0..b1 {
        let xs = &x[blk * 32..blk * 32 + 32];
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        // SAFETY: blk < out.len (asserted), and the block is ours alone.
        let q = unsafe { std::slice::from_raw_parts_mut(out.q.add(blk * 32), 32) };
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
        // SAFETY: as above.
        unsafe {
            *out.d.add(blk) = d;
            *out.sum.add(blk) = sum;
            *out.sum_lo.add(blk) = sum_lo;
            *out.dsum.add(blk) = d * sum as f32;
        }
    }
}

/// The same rule with AVX-512: `vcvtps2dq` rounds to nearest even (default
/// MXCSR), max and integer sums are exact, so codes match the scalar loop.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn quantize_avx512(x: &[f32], out: ActsPtr, b0: usize, b1: usize) {
    use std::arch::x86_64::*;
    let absmask = _mm512_set1_epi32(0x7FFF_FFFF);
    let (lo, hi) = (_mm512_set1_epi32(-127), _mm512_set1_epi32(127));
    for blk in b0..b1 {
        // SAFETY: the caller guarantees x holds 32 floats per block up to b1 and
        // that blocks b0..b1 of `out` are in bounds and exclusively ours.
        unsafe {
            let x0 = _mm512_loadu_ps(x.as_ptr().add(blk * 32));
            let x1 = _mm512_loadu_ps(x.as_ptr().add(blk * 32 + 16));
            let a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x0), absmask));
            let a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x1), absmask));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
            let d = amax / 127.0;
            let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
            let q0 = _mm512_min_epi32(
                _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x0, id)), lo),
                hi,
            );
            let q1 = _mm512_min_epi32(
                _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x1, id)), lo),
                hi,
            );
            _mm_storeu_si128(out.q.add(blk * 32).cast(), _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128(out.q.add(blk * 32 + 16).cast(), _mm512_cvtepi32_epi8(q1));
            let sum_lo = _mm512_reduce_add_epi32(q0);
            let sum = sum_lo + _mm512_reduce_add_epi32(q1);
            *out.d.add(blk) = d;
            *out.sum.add(blk) = sum;
            *out.sum_lo.add(blk) = sum_lo;
            *out.dsum.add(blk) = d * sum as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_isa_quantizes_identically() {
        let x: Vec<f32> = (0..32 * 50)
            .map(|i| ((i * 7919 % 2003) as f32 - 1000.0) * if i % 64 < 32 { 0.001 } else { 0.37 })
            .chain([0.5f32 * 127.0 / 127.0; 32])
            .collect();
        let mut want = QuantActs::new(51, 32);
        quantize(Isa::Portable, &x, &mut want);
        let pool = ThreadPool::new(2);
        for isa in Isa::available() {
            let mut got = QuantActs::new(51, 32);
            quantize_parallel(isa, &x, &mut got, &pool);
            assert_eq!(got.q, want.q, "{isa:?}");
            assert_eq!(got.sum, want.sum, "{isa:?}");
            assert_eq!(got.sum_lo, want.sum_lo, "{isa:?}");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got.d), bits(&want.d), "{isa:?}");
            assert_eq!(bits(&got.dsum), bits(&want.dsum), "{isa:?}");
        }
    }

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
        quantize(Isa::Portable, &x, &mut a);
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
        quantize(Isa::Portable, &zero, &mut a);
        assert_eq!(a.d[0], 0.0);
        assert!(a.q[..32].iter().all(|&q| q == 0));
    }
}
