//! SwiGLU's element-wise step `gate = silu(gate) · up` with the canonical
//! [`exp_neg`](super::vector::exp_neg) instead of libm `expf` (a call per element, ~5%
//! of a one-thread verify step): vectorized, and bit-identical on every ISA.
//! (Changes the logits' bits against libm: see
//! benchmarks/runs/kernels-worklog.md#session-7-epilogue.)
//!
//! Per element, from `e = e^{-|g|}` (never overflows): `sigmoid(g) = 1 / (1 + e)` for
//! `g >= 0` and `e / (1 + e)` for `g < 0`, then `g · sigmoid(g) · u`. Every step is one IEEE
//! operation (`exp_neg` included), so the vector forms reproduce the scalar one bit
//! for bit. Special values: NaN in `g` gives NaN; `+inf` gives `+inf · u`; `-inf` gives
//! NaN (`-inf · 0`, as the old `g / (1 + e^{-g})` did); below `g = -87.3` the result is
//! `-0 · u` (the true value is below 1e-36 in magnitude).

use super::simd::Isa;
use super::vector::exp_neg;

/// `silu(g) · u` for one element (the reference every ISA reproduces).
#[inline(always)]
pub fn silu_mul_one(g: f32, u: f32) -> f32 {
    let e = exp_neg(-g.abs());
    let sigmoid = if g >= 0.0 { 1.0 } else { e } / (1.0 + e);
    g * sigmoid * u
}

/// `gate[i] = silu(gate[i]) · up[i]` on the ISA chosen by [`super::detected`].
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    silu_mul_with_isa(super::detected(), gate, up)
}

/// [`silu_mul`] on a given ISA (falls back to portable if this CPU lacks it).
pub fn silu_mul_with_isa(isa: Isa, gate: &mut [f32], up: &[f32]) {
    let isa = if isa.is_supported() {
        isa
    } else {
        Isa::Portable
    };
    // SAFETY: `isa` is supported by this CPU (checked above).
    unsafe { silu_mul_unchecked(isa, gate, up) }
}

/// [`silu_mul_with_isa`] without the support check (for callers that checked once,
/// e.g. the matmul output write).
///
/// # Safety
/// This CPU must support `isa`.
#[inline]
pub(crate) unsafe fn silu_mul_unchecked(isa: Isa, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu_mul: gate and up lengths differ");
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller guarantees AVX-512F (part of Avx512Vnni) and FMA.
        Isa::Avx512Vnni => unsafe { silu_mul_avx512(gate, up) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller guarantees AVX2 and FMA (part of both AVX2 tiers).
        Isa::Avx2 | Isa::AvxVnni => unsafe { silu_mul_fma(gate, up) },
        _ => silu_mul_body(gate, up),
    }
}

#[inline(always)]
fn silu_mul_body(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu_mul_one(*g, u);
    }
}

/// The scalar form with FMA instructions (`mul_add` inlined, not a libm call).
/// AVX2 has no vector form here: the exp constants are private to `vector/softmax.rs`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn silu_mul_fma(gate: &mut [f32], up: &[f32]) {
    silu_mul_body(gate, up)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn silu_mul_avx512(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    let n = gate.len();
    let (pg, pu) = (gate.as_mut_ptr(), up.as_ptr());
    let mut i = 0;
    // SAFETY (this function): full vectors at i with i + 16 <= n, the tail with a
    // mask of the n - i < 16 remaining lanes; both slices are n long.
    unsafe {
        while i + 16 <= n {
            let r = silu_mul16(_mm512_loadu_ps(pg.add(i)), _mm512_loadu_ps(pu.add(i)));
            _mm512_storeu_ps(pg.add(i), r);
            i += 16;
        }
        if i < n {
            let m: __mmask16 = (1u32 << (n - i)) as u16 - 1;
            let g = _mm512_maskz_loadu_ps(m, pg.add(i));
            let u = _mm512_maskz_loadu_ps(m, pu.add(i));
            _mm512_mask_storeu_ps(pg.add(i), m, silu_mul16(g, u));
        }
    }
}

/// 16 lanes of [`silu_mul_one`], operation for operation.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn silu_mul16(
    g: std::arch::x86_64::__m512,
    u: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // -|g|: the sign bit set.
    let neg_abs = _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_castps_si512(g),
        _mm512_set1_epi32(i32::MIN),
    ));
    let e = super::vector::exp_neg_avx512(neg_abs);
    let one = _mm512_set1_ps(1.0);
    let pos = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(g, _mm512_setzero_ps());
    let num = _mm512_mask_mov_ps(e, pos, one);
    let sigmoid = _mm512_div_ps(num, _mm512_add_ps(one, e));
    _mm512_mul_ps(_mm512_mul_ps(g, sigmoid), u)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::uniform;

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    /// Random gates over the whole useful range plus the special values, every
    /// length 0..=40 (full vectors and every tail), every ISA: bits equal the scalar
    /// reference (NaN compared as NaN).
    #[test]
    fn every_isa_is_bit_identical_to_the_scalar_reference() {
        let mut seed = 5;
        let specials = [
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            87.0,
            -87.0,
            -87.4,
            100.0,
            -100.0,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
        ];
        for len in (0..=40).chain([1000, 4864]) {
            let mut g: Vec<f32> = uniform(&mut seed, len).iter().map(|v| v * 20.0).collect();
            let u: Vec<f32> = uniform(&mut seed, len).iter().map(|v| v * 3.0).collect();
            for (i, s) in specials.iter().enumerate() {
                if let Some(x) = g.get_mut((i * 7) % len.max(1)) {
                    *x = *s;
                }
            }
            let want: Vec<f32> = g
                .iter()
                .zip(&u)
                .map(|(&a, &b)| silu_mul_one(a, b))
                .collect();
            for isa in Isa::available() {
                let mut got = g.clone();
                silu_mul_with_isa(isa, &mut got, &u);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        same(*a, *b),
                        "{isa:?} len {len} [{i}] g={}: {a} vs {b}",
                        g[i]
                    );
                }
            }
        }
    }

    /// Against silu in f64 on a dense sweep: within a few ulp where the result is
    /// normal, and the special values as documented.
    #[test]
    fn matches_f64_silu() {
        let mut x = -90.0f32;
        while x < 90.0 {
            let got = silu_mul_one(x, 1.0) as f64;
            let xd = x as f64;
            let want = xd / (1.0 + (-xd).exp());
            if want.abs() > 1e-35 {
                assert!(
                    (got - want).abs() <= 6e-7 * want.abs(),
                    "x={x}: {got} vs {want}"
                );
            } else {
                assert!(got.abs() <= 1e-35, "x={x}: {got}");
            }
            x += 0.0031;
        }
        assert_eq!(silu_mul_one(0.0, 5.0), 0.0);
        assert_eq!(silu_mul_one(-100.0, 1.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(silu_mul_one(f32::INFINITY, 2.0), f32::INFINITY);
        assert_eq!(silu_mul_one(f32::MAX, 1.0), f32::MAX);
        assert!(silu_mul_one(f32::NEG_INFINITY, 1.0).is_nan());
        assert!(silu_mul_one(f32::NAN, 1.0).is_nan());
        assert!(silu_mul_one(1.0, f32::NAN).is_nan());
    }
}
