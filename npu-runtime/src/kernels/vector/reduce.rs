//! Reductions in a fixed order: the dot product and the f64 sum of squares.

use crate::kernels::simd::{detected, Isa};

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

/// Sum of squares in f64 (every square is exact there). Canonical order: 32 partial
/// sums, partial `l` accumulating elements `i ≡ l (mod 32)` of the full 32-chunks; then
/// pairwise folding (l + 16, l + 8, ..., l + 1); then the tail in order. Bit-identical on
/// every ISA; as accurate as a sequential f64 sum, without its 4-cycle chain per element
/// (RMS norm of a 896-wide row: ~0.8 us sequential).
pub fn sum_squares_f64(x: &[f32]) -> f64 {
    sum_squares_f64_with_isa(detected(), x)
}

/// [`sum_squares_f64`] compiled for a given ISA (portable if this CPU lacks it).
pub fn sum_squares_f64_with_isa(isa: Isa, x: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable && isa.is_supported() {
        // SAFETY: the CPU supports AVX2 (every non-portable ISA implies it).
        return unsafe { sum_squares_avx2(x) };
    }
    let _ = isa;
    sum_squares_body(x)
}

/// The same source with AVX2 enabled: the 32 partials vectorise; Rust never reassociates
/// or contracts float operations, so the result is the portable one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum_squares_avx2(x: &[f32]) -> f64 {
    sum_squares_body(x)
}

#[inline(always)]
fn sum_squares_body(x: &[f32]) -> f64 {
    let mut acc = [0f64; 32];
    let chunks = x.chunks_exact(32);
    let tail = chunks.remainder();
    for ch in chunks {
        for (a, &v) in acc.iter_mut().zip(ch) {
            let v = f64::from(v);
            *a += v * v;
        }
    }
    let mut w = 16;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    tail.iter().fold(acc[0], |s, &v| {
        let v = f64::from(v);
        s + v * v
    })
}
