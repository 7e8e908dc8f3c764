//! Small f32 vector helpers with a fixed, documented reduction order, so a
//! value never depends on batch size, thread count or ISA.

use super::simd::{detected, Isa};

/// Dot product. Canonical order: 16 partial sums, partial `l` accumulating
/// elements `i ≡ l (mod 16)` of the full 16-chunks with fused multiply-add;
/// then pairwise folding (l + 8, l + 4, l + 2, l + 1); then the tail elements
/// fused in order. Bit-identical on every ISA.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot_f32_with_isa(detected(), a, b)
}

/// [`dot_f32`] compiled for a given ISA (portable if this CPU lacks it).
pub fn dot_f32_with_isa(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable && isa.is_supported() {
        // SAFETY: the CPU supports AVX2 and FMA (every non-portable ISA implies them).
        return unsafe { dot_fma(a, b) };
    }
    let _ = isa;
    dot_body(a, b)
}

/// The same source compiled with FMA/AVX2 enabled: `mul_add` becomes `vfmadd`
/// and the 16 lanes vectorise; Rust never reassociates float operations, so
/// the result is the portable one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dot_fma(a: &[f32], b: &[f32]) -> f32 {
    dot_body(a, b)
}

#[inline(always)]
fn dot_body(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let ca = a.chunks_exact(16);
    let cb = b.chunks_exact(16);
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..16 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    let mut w = 8;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    let mut s = acc[0];
    for (x, y) in ta.iter().zip(tb) {
        s = x.mul_add(*y, s);
    }
    s
}

/// `y[i] += alpha * x[i]` (fused), element-wise, so order-free.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if detected() != Isa::Portable {
        // SAFETY: every non-portable ISA implies AVX2 and FMA support.
        return unsafe { axpy_fma(alpha, x, y) };
    }
    axpy_body(alpha, x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn axpy_fma(alpha: f32, x: &[f32], y: &mut [f32]) {
    axpy_body(alpha, x, y)
}

#[inline(always)]
fn axpy_body(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y = alpha.mul_add(*x, *y);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_f64_and_handles_tails() {
        for n in [0usize, 1, 15, 16, 17, 64, 100] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot_f32(&a, &b) as f64 - want).abs() < 1e-4, "n={n}");
        }
    }

    #[test]
    fn dot_is_bit_identical_across_isas() {
        for n in [1usize, 16, 33, 64, 100, 896] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.731).sin() * 3.0).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.219).cos()).collect();
            let want = dot_f32_with_isa(Isa::Portable, &a, &b);
            for isa in Isa::available() {
                assert_eq!(
                    dot_f32_with_isa(isa, &a, &b).to_bits(),
                    want.to_bits(),
                    "{isa:?} n={n}"
                );
            }
        }
    }

    #[test]
    fn softmax_sums_to_one_and_survives_neg_inf() {
        let mut x = vec![1.0, 2.0, f32::NEG_INFINITY, 3.0];
        softmax_inplace(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(x[2], 0.0);
        let mut y = vec![f32::NEG_INFINITY; 3];
        softmax_inplace(&mut y);
        assert_eq!(y, vec![0.0; 3]);
        let mut z = vec![1.0, 2.0];
        axpy(2.0, &[1.0, 1.0], &mut z);
        assert_eq!(z, vec![3.0, 4.0]);
    }
}
