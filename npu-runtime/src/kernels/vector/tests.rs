use super::softmax::EXP_LO;
use super::*;
use crate::kernels::kv_elem::KvElem;
use crate::kernels::simd::Isa;

#[test]
fn dot_matches_f64_and_handles_tails() {
    for n in [0usize, 1, 15, 16, 17, 64, 100] {
        let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot_f32(&a, &b) as f64 - want).abs() < 1e-4, "n={n}");
    }
}

/// Every length up to 200 and the models' widths: every ISA gives the portable bits,
/// and the sum agrees with a sequential f64 sum (both err by at most ~n ulp).
#[test]
fn sum_squares_is_bit_identical_across_isas_and_accurate() {
    let mut seed = 0x5_DEEC_E66Du64;
    for n in (0..200).chain([576, 896, 1536, 4864, 8960]) {
        let x: Vec<f32> = rnd(&mut seed, n)
            .iter()
            .enumerate()
            .map(|(i, v)| v * if i % 17 == 0 { 300.0 } else { 1.0 })
            .collect();
        let want = sum_squares_f64_with_isa(Isa::Portable, &x);
        for isa in Isa::available() {
            let got = sum_squares_f64_with_isa(isa, &x);
            assert_eq!(got.to_bits(), want.to_bits(), "{isa:?} n={n}");
        }
        let seq: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        assert!((want - seq).abs() <= 1e-13 * seq, "n={n}: {want} vs {seq}");
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

use crate::test_rng::uniform as rnd;

/// Rows as the KV cache stores them in element type `T`: the values as stored (for
/// the references) and the stored elements (for the kernels).
fn cached_rows<T: KvElem>(x: Vec<f32>) -> (Vec<f32>, Vec<T>) {
    let stored: Vec<T> = x.iter().map(|&v| T::narrow(v)).collect();
    (stored.iter().map(|&h| h.widen()).collect(), stored)
}

#[test]
fn axpy_rows_equals_sequential_axpy_on_every_isa() {
    axpy_rows_equals_sequential_axpy::<f32>();
    axpy_rows_equals_sequential_axpy::<half::f16>();
}

fn axpy_rows_equals_sequential_axpy<T: KvElem>() {
    let mut seed = 5;
    for (len, stride, n) in [
        (64usize, 128usize, 37usize),
        (20, 20, 5),
        (17, 40, 1),
        (64, 64, 0),
    ] {
        let w = rnd(&mut seed, n);
        let (rows, stored) = cached_rows::<T>(rnd(&mut seed, n.max(1) * stride));
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
            axpy_rows_with_isa(isa, &w, &stored, stride, &mut acc);
            let got: Vec<u32> = acc.iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, want, "{isa:?} half {} len={len} n={n}", T::HALF);
        }
    }
}

#[test]
fn axpy_rows_multi_equals_sequential_fma_on_every_isa() {
    axpy_rows_multi_equals_sequential_fma::<f32>();
    axpy_rows_multi_equals_sequential_fma::<half::f16>();
}

fn axpy_rows_multi_equals_sequential_fma<T: KvElem>() {
    let mut seed = 13;
    for case in 0..40 {
        let len = [64usize, 16, 20, 80, 128, 3][case % 6];
        let stride = len + (case % 3) * 8;
        let n_q = 1 + case % 7;
        let n_rows = [1usize, 2, 16, 37, 100][case % 5];
        let w_stride = n_rows + case % 5;
        let w = rnd(&mut seed, (n_q - 1) * w_stride + n_rows);
        let (rows, stored) = cached_rows::<T>(rnd(&mut seed, (n_rows - 1) * stride + len));
        let init = rnd(&mut seed, n_q * len);
        let mut want = init.clone();
        for a in 0..n_q {
            for j in 0..n_rows {
                for d in 0..len {
                    let y = &mut want[a * len + d];
                    *y = w[a * w_stride + j].mul_add(rows[j * stride + d], *y);
                }
            }
        }
        // Prefetching (0, inside the rows, far past their end) must not change a bit.
        let pf = [0usize, 16, 1000][case % 3];
        for isa in Isa::available() {
            let mut acc = init.clone();
            axpy_rows_multi_with_isa(
                isa, &w, w_stride, n_rows, &stored, stride, &mut acc, len, pf,
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&acc),
                bits(&want),
                "{isa:?} half {} case {case}",
                T::HALF
            );
        }
    }
}

#[test]
fn exp_neg_is_accurate() {
    let mut x = 0.0f32;
    while x > -90.0 {
        let got = exp_neg(x) as f64;
        let want = (x as f64).exp();
        if x >= -87.3 {
            assert!(
                (got - want).abs() <= 2.5e-7 * want,
                "x={x}: {got} vs {want}"
            );
        }
        x -= 0.0137;
    }
    assert_eq!(exp_neg(0.0), 1.0);
    assert_eq!(exp_neg(-100.0), 0.0);
    assert_eq!(exp_neg(f32::NEG_INFINITY), 0.0);
}

/// The vector exponential equals the scalar one bit for bit on a dense sweep of its
/// range, including the subnormal results just above `EXP_LO` and the flushed lanes.
#[test]
#[cfg(target_arch = "x86_64")]
fn exp_neg_avx512_is_bit_identical_to_scalar() {
    use std::arch::x86_64::*;
    if !Isa::Avx512Vnni.is_supported() {
        return;
    }
    let mut xs: Vec<f32> = (0..200_000).map(|i| -(i as f32) * 0.000_45).collect();
    let lo = EXP_LO.to_bits();
    xs.extend((0..4096u32).map(|k| f32::from_bits(lo - 2048 + k)));
    xs.extend([0.0, -0.0, -1e-30, f32::NEG_INFINITY, -100.0, f32::NAN]);
    while !xs.len().is_multiple_of(16) {
        xs.push(-1.0);
    }
    for ch in xs.chunks_exact(16) {
        let mut got = [0f32; 16];
        // SAFETY: AVX-512F is present (checked above); 16-float loads and stores.
        unsafe {
            let e = exp_neg_avx512(_mm512_loadu_ps(ch.as_ptr()));
            _mm512_storeu_ps(got.as_mut_ptr(), e);
        }
        for (x, g) in ch.iter().zip(got) {
            assert_eq!(g.to_bits(), exp_neg(*x).to_bits(), "x={x:e}");
        }
    }
}

#[test]
fn softmax_exp_is_bit_identical_across_isas_and_matches_f64() {
    let mut seed = 17;
    // (A spread of 4000 puts most scaled scores more than 87 below the max: the
    // flush-to-zero lanes.)
    for (n, spread) in [1usize, 7, 16, 17, 64, 100, 1001]
        .into_iter()
        .flat_map(|n| [(n, 40.0f32), (n, 4000.0)])
    {
        let base: Vec<f32> = rnd(&mut seed, n).iter().map(|v| v * spread).collect();
        let scale = 0.125;
        let mut want = base.clone();
        let want_sum = softmax_exp_with_isa(Isa::Portable, &mut want, scale);
        let m = base
            .iter()
            .map(|v| (v * scale) as f64)
            .fold(f64::MIN, f64::max);
        let mut z = 0.0;
        for (w, b) in want.iter().zip(&base) {
            let e = ((b * scale) as f64 - m).exp();
            assert!(
                (*w as f64 - e).abs() <= 1e-6 * e.max(1e-30) + 1e-37,
                "n={n}"
            );
            z += e;
        }
        assert!((want_sum as f64 - z).abs() <= 1e-5 * z, "n={n}");
        for isa in Isa::available() {
            let mut got = base.clone();
            let sum = softmax_exp_with_isa(isa, &mut got, scale);
            assert_eq!(sum.to_bits(), want_sum.to_bits(), "{isa:?} n={n}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{isa:?} n={n}");
        }
    }
}
