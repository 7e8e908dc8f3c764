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
    dot_finish(acc, ta, tb)
}

/// The canonical epilogue of [`dot_f32`]: pairwise fold of the 16 partials, then the
/// tail elements fused in order.
#[inline(always)]
fn dot_finish(mut acc: [f32; 16], ta: &[f32], tb: &[f32]) -> f32 {
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

/// `out[j] = dot_f32(q, rows[j * stride..][..q.len()])` for every `j < out.len()`:
/// the same bits as calling [`dot_f32`] per row, dispatched once for all rows.
pub fn dot_rows_f32(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    dot_rows_f32_with_isa(detected(), q, rows, stride, out)
}

/// [`dot_rows_f32`] compiled for a given ISA (portable if this CPU lacks it).
pub fn dot_rows_f32_with_isa(isa: Isa, q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    if let Some(last) = out.len().checked_sub(1) {
        assert!(
            last * stride + q.len() <= rows.len(),
            "dot_rows_f32: rows too short"
        );
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable && isa.is_supported() {
        // SAFETY: the CPU supports AVX2 and FMA (every non-portable ISA implies them).
        return unsafe { dot_rows_fma(q, rows, stride, out) };
    }
    let _ = isa;
    dot_rows_body(q, rows, stride, out)
}

/// AVX2 form of [`dot_body`] per row: lanes 0-7 and 8-15 of the 16 partials live in
/// two registers, and the fold adds the same pairs as the portable one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dot_rows_fma(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = q.len();
    let full = n - n % 16;
    for (j, o) in out.iter_mut().enumerate() {
        let r = &rows[j * stride..][..n];
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for (x, y) in q[..full].chunks_exact(16).zip(r[..full].chunks_exact(16)) {
            // SAFETY: `x` and `y` hold exactly 16 floats, so both 8-float loads at
            // offsets 0 and 8 are in bounds (unaligned loads are allowed).
            unsafe {
                let (xp, yp) = (x.as_ptr(), y.as_ptr());
                lo = _mm256_fmadd_ps(_mm256_loadu_ps(xp), _mm256_loadu_ps(yp), lo);
                hi = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(8)), _mm256_loadu_ps(yp.add(8)), hi);
            }
        }
        let s8 = _mm256_add_ps(lo, hi); // l + 8
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)); // l + 4
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4)); // l + 2
        let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)); // l + 1
        let mut s = _mm_cvtss_f32(s1);
        for (x, y) in q[full..].iter().zip(&r[full..]) {
            s = x.mul_add(*y, s);
        }
        *o = s;
    }
}

#[inline(always)]
fn dot_rows_body(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = dot_body(q, &rows[j * stride..][..q.len()]);
    }
}

/// `acc[d] += w[j] * rows[j * stride + d]` for `j` ascending, fused: the same bits as
/// calling [`axpy`] once per row in order, dispatched once for all rows.
pub fn axpy_rows(w: &[f32], rows: &[f32], stride: usize, acc: &mut [f32]) {
    axpy_rows_with_isa(detected(), w, rows, stride, acc)
}

/// [`axpy_rows`] compiled for a given ISA (portable if this CPU lacks it).
pub fn axpy_rows_with_isa(isa: Isa, w: &[f32], rows: &[f32], stride: usize, acc: &mut [f32]) {
    if let Some(last) = w.len().checked_sub(1) {
        assert!(
            last * stride + acc.len() <= rows.len(),
            "axpy_rows: rows too short"
        );
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable && isa.is_supported() {
        // SAFETY: the CPU supports AVX2 and FMA (every non-portable ISA implies them).
        return unsafe { axpy_rows_fma(w, rows, stride, acc) };
    }
    let _ = isa;
    axpy_rows_body(w, rows, stride, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn axpy_rows_fma(w: &[f32], rows: &[f32], stride: usize, acc: &mut [f32]) {
    axpy_rows_body(w, rows, stride, acc)
}

/// Column blocks outer, rows inner, so each block's accumulator stays in registers;
/// every element still sees the rows' fused multiply-adds in ascending order.
#[inline(always)]
fn axpy_rows_body(w: &[f32], rows: &[f32], stride: usize, acc: &mut [f32]) {
    let mut c = 0;
    while c + 64 <= acc.len() {
        axpy_rows_block::<64>(w, rows, stride, c, acc);
        c += 64;
    }
    while c + 16 <= acc.len() {
        axpy_rows_block::<16>(w, rows, stride, c, acc);
        c += 16;
    }
    for d in c..acc.len() {
        let mut a = acc[d];
        for (j, &wj) in w.iter().enumerate() {
            a = wj.mul_add(rows[j * stride + d], a);
        }
        acc[d] = a;
    }
}

#[inline(always)]
fn axpy_rows_block<const B: usize>(
    w: &[f32],
    rows: &[f32],
    stride: usize,
    c: usize,
    acc: &mut [f32],
) {
    let mut a = [0f32; B];
    a.copy_from_slice(&acc[c..c + B]);
    for (j, &wj) in w.iter().enumerate() {
        let x = &rows[j * stride + c..][..B];
        for l in 0..B {
            a[l] = wj.mul_add(x[l], a[l]);
        }
    }
    acc[c..c + B].copy_from_slice(&a);
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

    fn rnd(seed: &mut u64, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn dot_rows_equals_per_row_dot_on_every_isa() {
        let mut seed = 3;
        for (len, stride, n) in [
            (64usize, 128usize, 37usize),
            (20, 20, 5),
            (17, 40, 1),
            (64, 64, 0),
        ] {
            let q = rnd(&mut seed, len);
            let rows = rnd(&mut seed, n.max(1) * stride);
            let want: Vec<u32> = (0..n)
                .map(|j| dot_f32_with_isa(Isa::Portable, &q, &rows[j * stride..][..len]).to_bits())
                .collect();
            for isa in Isa::available() {
                let mut out = vec![0f32; n];
                dot_rows_f32_with_isa(isa, &q, &rows, stride, &mut out);
                let got: Vec<u32> = out.iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, want, "{isa:?} len={len} n={n}");
            }
        }
    }

    #[test]
    fn axpy_rows_equals_sequential_axpy_on_every_isa() {
        let mut seed = 5;
        for (len, stride, n) in [
            (64usize, 128usize, 37usize),
            (20, 20, 5),
            (17, 40, 1),
            (64, 64, 0),
        ] {
            let w = rnd(&mut seed, n);
            let rows = rnd(&mut seed, n.max(1) * stride);
            let init = rnd(&mut seed, len);
            // Scalar reference: one fused multiply-add per element, rows in order.
            let mut want = init.clone();
            for (j, &wj) in w.iter().enumerate() {
                for (d, y) in want.iter_mut().enumerate() {
                    *y = wj.mul_add(rows[j * stride + d], *y);
                }
            }
            let want: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
            let mut via_axpy = init.clone();
            for (j, &wj) in w.iter().enumerate() {
                axpy(wj, &rows[j * stride..][..len], &mut via_axpy);
            }
            assert_eq!(
                via_axpy.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want
            );
            for isa in Isa::available() {
                let mut acc = init.clone();
                axpy_rows_with_isa(isa, &w, &rows, stride, &mut acc);
                let got: Vec<u32> = acc.iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, want, "{isa:?} len={len} n={n}");
            }
        }
    }
}
