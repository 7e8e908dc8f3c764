//! The canonical `e^x` for `x <= 0` (scalar, AVX2 and AVX-512 forms with the same bits) and
//! the softmax built on it.

use crate::kernels::simd::Isa;

/// Canonical `e^x` for `x <= 0` (softmax weights): Cephes-style range reduction
/// `x = n·ln2 + r` (two-constant split, `n` rounded half-to-even) and a degree-6
/// polynomial evaluated with fused multiply-adds, times `2^n`; `x < -87.33` gives 0.
/// Every step is one IEEE operation, so the vector forms reproduce it bit for bit.
/// Relative error below 2e-7 on `[-87, 0]` (tested against f64).
#[inline(always)]
pub fn exp_neg(x: f32) -> f32 {
    // Also maps NaN to 0, as the vector form's ordered compare does.
    if x.partial_cmp(&EXP_LO).is_none_or(|o| o.is_lt()) {
        return 0.0;
    }
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = n.mul_add(-EXP_LN2_HI, x);
    let r = n.mul_add(-EXP_LN2_LO, r);
    let mut p = EXP_C[0];
    for &c in &EXP_C[1..] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    // n is in [-126, 0] here, so the biased exponent is a normal one.
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

pub(crate) const EXP_LO: f32 = -87.336_54;
const EXP_LN2_HI: f32 = 0.693_359_4;
const EXP_LN2_LO: f32 = -2.121_944_4e-4;
const EXP_C: [f32; 6] = [
    1.987_569_1e-4,
    1.398_2e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// Softmax numerator in place: `s[i] = exp_neg(s[i] * scale - max)` with `max` the
/// largest scaled score, and returns their sum in the canonical order of [`dot_f32`]
/// (16 partials by index mod 16, pairwise fold, then the tail in order).
pub fn softmax_exp_with_isa(isa: Isa, s: &mut [f32], scale: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni && isa.is_supported() {
        // SAFETY: the CPU supports AVX-512F, AVX2 and FMA.
        return unsafe { softmax_exp_avx512(s, scale) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable && isa.is_supported() {
        // SAFETY: the CPU supports AVX2 and FMA.
        return unsafe { softmax_exp_avx2(s, scale) };
    }
    let _ = isa;
    softmax_exp_body(s, scale)
}

#[inline(always)]
fn softmax_exp_body(s: &mut [f32], scale: f32) -> f32 {
    let mut max = f32::NEG_INFINITY;
    for v in s.iter_mut() {
        *v *= scale;
        max = max.max(*v);
    }
    let mut acc = [0f32; 16];
    let mut chunks = s.chunks_exact_mut(16);
    for ch in &mut chunks {
        for (a, v) in acc.iter_mut().zip(ch.iter_mut()) {
            *v = exp_neg(*v - max);
            *a += *v;
        }
    }
    let tail = chunks.into_remainder();
    for v in tail.iter_mut() {
        *v = exp_neg(*v - max);
    }
    let mut w = 8;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    let mut sum = acc[0];
    for v in tail.iter() {
        sum += *v;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn softmax_exp_avx512(s: &mut [f32], scale: f32) -> f32 {
    use std::arch::x86_64::*;
    let n = s.len();
    let full = n - n % 16;
    let p = s.as_mut_ptr();
    let vscale = _mm512_set1_ps(scale);
    let mut vmax = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    // SAFETY (this function): every vector access is at i with i + 16 <= full <= n.
    unsafe {
        while i < full {
            let v = _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), vscale);
            _mm512_storeu_ps(p.add(i), v);
            vmax = _mm512_max_ps(vmax, v);
            i += 16;
        }
    }
    // Max is exact, so its order does not matter (scores are never NaN here).
    let mut max = _mm512_reduce_max_ps(vmax);
    for v in s[full..].iter_mut() {
        *v *= scale;
        max = max.max(*v);
    }
    let vmax = _mm512_set1_ps(max);
    let mut acc = _mm512_setzero_ps();
    i = 0;
    // SAFETY: as above.
    unsafe {
        while i < full {
            let e = exp_neg_avx512(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), vmax));
            _mm512_storeu_ps(p.add(i), e);
            acc = _mm512_add_ps(acc, e);
            i += 16;
        }
    }
    for v in s[full..].iter_mut() {
        *v = exp_neg(*v - max);
    }
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
    let s8 = _mm256_add_ps(_mm512_castps512_ps256(acc), hi);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    let mut sum = _mm_cvtss_f32(s1);
    for v in s[full..].iter() {
        sum += *v;
    }
    sum
}

/// [`softmax_exp_avx512`] on 256 bits: the 16 partials are two 8-lane accumulators
/// (indices 0..8 and 8..16 of each 16-element chunk), folded as `dot_f32`'s tree.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_exp_avx2(s: &mut [f32], scale: f32) -> f32 {
    use std::arch::x86_64::*;
    let n = s.len();
    let full = n - n % 16;
    let p = s.as_mut_ptr();
    let vscale = _mm256_set1_ps(scale);
    let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    // SAFETY (this function): every vector access is at i with i + 8 <= full <= n.
    unsafe {
        while i < full {
            let v = _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), vscale);
            _mm256_storeu_ps(p.add(i), v);
            vmax = _mm256_max_ps(vmax, v);
            i += 8;
        }
    }
    // Max is exact, so its order does not matter (scores are never NaN here).
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds the 8 floats stored.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), vmax) };
    let mut max = lanes.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    for v in s[full..].iter_mut() {
        *v *= scale;
        max = max.max(*v);
    }
    let vmax = _mm256_set1_ps(max);
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    i = 0;
    // SAFETY: as above.
    unsafe {
        while i < full {
            let e0 = exp_neg_avx2(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), vmax));
            let e1 = exp_neg_avx2(_mm256_sub_ps(_mm256_loadu_ps(p.add(i + 8)), vmax));
            _mm256_storeu_ps(p.add(i), e0);
            _mm256_storeu_ps(p.add(i + 8), e1);
            lo = _mm256_add_ps(lo, e0);
            hi = _mm256_add_ps(hi, e1);
            i += 16;
        }
    }
    for v in s[full..].iter_mut() {
        *v = exp_neg(*v - max);
    }
    let s8 = _mm256_add_ps(lo, hi);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    let mut sum = _mm_cvtss_f32(s1);
    for v in s[full..].iter() {
        sum += *v;
    }
    sum
}

/// 8 lanes of [`exp_neg`], operation for operation.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn exp_neg_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_LN2_HI), x);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_LN2_LO), r);
    let mut p = _mm256_set1_ps(EXP_C[0]);
    for &c in &EXP_C[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(
        _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
        _mm256_set1_ps(1.0),
    );
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    let e = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
    // Ordered compare: false for NaN, which becomes 0 as in the scalar form.
    let keep = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(EXP_LO));
    _mm256_and_ps(e, keep)
}

/// 16 lanes of [`exp_neg`], operation for operation.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) fn exp_neg_avx512(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-EXP_LN2_HI), x);
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-EXP_LN2_LO), r);
    let mut p = _mm512_set1_ps(EXP_C[0]);
    for &c in &EXP_C[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let y = _mm512_add_ps(
        _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
        _mm512_set1_ps(1.0),
    );
    let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(n),
        _mm512_set1_epi32(127),
    ));
    let e = _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
    let keep = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(EXP_LO));
    _mm512_maskz_mov_ps(keep, e)
}

/// Numerically stable in-place softmax; sums sequentially. An all `-inf`
/// input becomes all zeros rather than NaN.
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        x.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}
