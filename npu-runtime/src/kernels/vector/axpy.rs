//! `y += alpha * x` and the attention's weighted sums of V rows (one or several queries per
//! row load), reading the rows as the KV cache stores them (f32, or half floats widened
//! exactly).

#[cfg(target_arch = "x86_64")]
use crate::kernels::attn_tiles::{row16, row8};
use crate::kernels::kv_elem::KvElem;
use crate::kernels::simd::{detected, Isa};

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

/// `acc[d] += w[j] * rows[j * stride + d]` for `j` ascending, fused (half-float rows
/// widened exactly): the same bits as calling [`axpy`] once per (widened) row in order,
/// dispatched once for all rows.
pub fn axpy_rows<T: KvElem>(w: &[f32], rows: &[T], stride: usize, acc: &mut [f32]) {
    axpy_rows_with_isa(detected(), w, rows, stride, acc)
}

/// [`axpy_rows`] compiled for a given ISA (portable if this CPU lacks it).
pub fn axpy_rows_with_isa<T: KvElem>(
    isa: Isa,
    w: &[f32],
    rows: &[T],
    stride: usize,
    acc: &mut [f32],
) {
    if let Some(last) = w.len().checked_sub(1) {
        assert!(
            last * stride + acc.len() <= rows.len(),
            "axpy_rows: rows too short"
        );
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni && isa.is_supported() && !w.is_empty() && !acc.is_empty() {
        let (n, len) = (w.len(), acc.len());
        // SAFETY: the CPU supports AVX-512F, AVX2 and FMA; bounds were checked above.
        return unsafe { axpy_multi_avx512::<T, 1>(w, n, n, rows, stride, acc, len, 0) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable && isa.is_supported() {
        // SAFETY: the CPU supports AVX2, FMA and F16C (every non-portable ISA implies
        // them).
        return unsafe { axpy_rows_fma(w, rows, stride, acc) };
    }
    let _ = isa;
    axpy_rows_body(w, rows, stride, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn axpy_rows_fma<T: KvElem>(w: &[f32], rows: &[T], stride: usize, acc: &mut [f32]) {
    axpy_rows_body(w, rows, stride, acc)
}

/// Column blocks outer, rows inner, so each block's accumulator stays in registers;
/// every element still sees the rows' fused multiply-adds in ascending order.
#[inline(always)]
fn axpy_rows_body<T: KvElem>(w: &[f32], rows: &[T], stride: usize, acc: &mut [f32]) {
    let mut c = 0;
    while c + 64 <= acc.len() {
        axpy_rows_block::<T, 64>(w, rows, stride, c, acc);
        c += 64;
    }
    while c + 16 <= acc.len() {
        axpy_rows_block::<T, 16>(w, rows, stride, c, acc);
        c += 16;
    }
    for d in c..acc.len() {
        let mut a = acc[d];
        for (j, &wj) in w.iter().enumerate() {
            a = wj.mul_add(rows[j * stride + d].widen(), a);
        }
        acc[d] = a;
    }
}

#[inline(always)]
fn axpy_rows_block<T: KvElem, const B: usize>(
    w: &[f32],
    rows: &[T],
    stride: usize,
    c: usize,
    acc: &mut [f32],
) {
    let mut a = [0f32; B];
    a.copy_from_slice(&acc[c..c + B]);
    for (j, &wj) in w.iter().enumerate() {
        let x = &rows[j * stride + c..][..B];
        for l in 0..B {
            a[l] = wj.mul_add(x[l].widen(), a[l]);
        }
    }
    acc[c..c + B].copy_from_slice(&a);
}

/// The shared shape of the multi-query row kernels: `n_q` query vectors of `len`, `n_rows`
/// rows of `len` at `stride`, and per query one run of `n_rows` scalars (scores out, or
/// weights in) at `per_query_stride`.
struct MultiShape {
    len: usize,
    stride: usize,
    n_rows: usize,
    per_query_stride: usize,
}

impl MultiShape {
    /// `n_q`, or `None` when there is nothing to do; panics when a slice is too short (the
    /// SIMD paths rely on these bounds).
    fn check(&self, kernel: &str, vecs: usize, rows: usize, per_query: usize) -> Option<usize> {
        let n_q = vecs.checked_div(self.len).unwrap_or(0);
        assert_eq!(
            n_q * self.len,
            vecs,
            "{kernel}: vectors are not n_q rows of len"
        );
        if self.n_rows == 0 || n_q == 0 {
            return None;
        }
        assert!(
            (self.n_rows - 1) * self.stride + self.len <= rows,
            "{kernel}: rows too short"
        );
        assert!(
            (n_q - 1) * self.per_query_stride + self.n_rows <= per_query,
            "{kernel}: per-query scores/weights too short"
        );
        Some(n_q)
    }
}

/// Multi-query form of [`axpy_rows`]: for every query `a < n_q`,
/// `acc[a * len + d] += w[a * w_stride + j] * rows[j * stride + d]`, rows `j < n_rows`
/// ascending, fused (half-float rows widened exactly). Each row is loaded once for up to
/// four queries. Bits equal [`axpy_rows`] per query.
///
/// `prefetch_rows > 0`: while the first queries pass over row `j`, the SIMD kernels
/// prefetch row `j + prefetch_rows` (a hint; rows past the slice are never read), so a
/// caller walking a long run of rows in chunks has the next chunk on its way.
#[allow(clippy::too_many_arguments)]
pub fn axpy_rows_multi_with_isa<T: KvElem>(
    isa: Isa,
    w: &[f32],
    w_stride: usize,
    n_rows: usize,
    rows: &[T],
    stride: usize,
    acc: &mut [f32],
    len: usize,
    prefetch_rows: usize,
) {
    let shape = MultiShape {
        len,
        stride,
        n_rows,
        per_query_stride: w_stride,
    };
    let Some(n_q) = shape.check("axpy_rows_multi", acc.len(), rows.len(), w.len()) else {
        return;
    };
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni && isa.is_supported() {
        let mut a0 = 0;
        while a0 < n_q {
            let h = (n_q - a0).min(4);
            let (w, acc) = (&w[a0 * w_stride..], &mut acc[a0 * len..(a0 + h) * len]);
            // The first group brings the rows into L1; later groups find them there.
            let pf = if a0 == 0 { prefetch_rows } else { 0 };
            // SAFETY: the CPU supports AVX-512F and FMA; the bounds checked above cover
            // the `h` queries starting at `a0`.
            unsafe {
                match h {
                    4 => axpy_multi_avx512::<T, 4>(w, w_stride, n_rows, rows, stride, acc, len, pf),
                    3 => axpy_multi_avx512::<T, 3>(w, w_stride, n_rows, rows, stride, acc, len, pf),
                    2 => axpy_multi_avx512::<T, 2>(w, w_stride, n_rows, rows, stride, acc, len, pf),
                    _ => axpy_multi_avx512::<T, 1>(w, w_stride, n_rows, rows, stride, acc, len, pf),
                }
            }
            a0 += h;
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable && isa.is_supported() {
        let mut a0 = 0;
        while a0 < n_q {
            let h = (n_q - a0).min(2);
            let (w, acc) = (&w[a0 * w_stride..], &mut acc[a0 * len..(a0 + h) * len]);
            let pf = if a0 == 0 { prefetch_rows } else { 0 };
            // SAFETY: the CPU supports AVX2, FMA and F16C; the bounds checked above cover
            // the `h` queries starting at `a0`.
            unsafe {
                match h {
                    2 => axpy_multi_avx2::<T, 2>(w, w_stride, n_rows, rows, stride, acc, len, pf),
                    _ => axpy_multi_avx2::<T, 1>(w, w_stride, n_rows, rows, stride, acc, len, pf),
                }
            }
            a0 += h;
        }
        return;
    }
    for (a, acc) in acc.chunks_exact_mut(len).enumerate() {
        axpy_rows_with_isa(isa, &w[a * w_stride..][..n_rows], rows, stride, acc);
    }
}

/// [`axpy_multi_avx512`] on 256 bits: column blocks of 32 (then 8, then scalar), `H`
/// queries per row load (16 ymm registers: 2 queries x 4 vectors of accumulators).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn axpy_multi_avx2<T: KvElem, const H: usize>(
    w: &[f32],
    w_stride: usize,
    n_rows: usize,
    rows: &[T],
    stride: usize,
    acc: &mut [f32],
    len: usize,
    pf: usize,
) {
    use std::arch::x86_64::*;
    let mut c = 0;
    while c + 8 <= len {
        let nv = if c + 32 <= len { 4 } else { 1 };
        let mut r = [[_mm256_setzero_ps(); 4]; H];
        // SAFETY (this block): acc at a * len + c + 8 * t + 8 <= H * len, rows at
        // j * stride + c + 8 * nv <= (n_rows - 1) * stride + len, w at a * w_stride + j <
        // (H - 1) * w_stride + n_rows (the caller's extents).
        unsafe {
            for (a, r) in r.iter_mut().enumerate() {
                for (t, r) in r.iter_mut().enumerate().take(nv) {
                    *r = _mm256_loadu_ps(acc.as_ptr().add(a * len + c + 8 * t));
                }
            }
            for j in 0..n_rows {
                let base = rows.as_ptr().add(j * stride + c);
                if pf > 0 {
                    let bytes = 8 * nv * std::mem::size_of::<T>();
                    prefetch_lines(base.wrapping_add(pf * stride).cast(), bytes);
                }
                let mut wb = [_mm256_setzero_ps(); H];
                for (a, wb) in wb.iter_mut().enumerate() {
                    *wb = _mm256_set1_ps(*w.get_unchecked(a * w_stride + j));
                }
                if nv == 4 {
                    for t in 0..4 {
                        let v = row8(base.add(8 * t));
                        for (r, wb) in r.iter_mut().zip(&wb) {
                            r[t] = _mm256_fmadd_ps(*wb, v, r[t]);
                        }
                    }
                } else {
                    let v = row8(base);
                    for (r, wb) in r.iter_mut().zip(&wb) {
                        r[0] = _mm256_fmadd_ps(*wb, v, r[0]);
                    }
                }
            }
            for (a, r) in r.iter().enumerate() {
                for (t, r) in r.iter().enumerate().take(nv) {
                    _mm256_storeu_ps(acc.as_mut_ptr().add(a * len + c + 8 * t), *r);
                }
            }
        }
        c += 8 * nv;
    }
    for a in 0..H {
        for d in c..len {
            let mut s = acc[a * len + d];
            for j in 0..n_rows {
                s = w[a * w_stride + j].mul_add(rows[j * stride + d].widen(), s);
            }
            acc[a * len + d] = s;
        }
    }
}

/// `H` queries at once over column blocks of 64 (then 16, then scalar): the row block is
/// loaded once and fused into each query's accumulators, which stay in registers. With
/// `pf > 0` each block also prefetches its columns of the row `pf` rows ahead.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn axpy_multi_avx512<T: KvElem, const H: usize>(
    w: &[f32],
    w_stride: usize,
    n_rows: usize,
    rows: &[T],
    stride: usize,
    acc: &mut [f32],
    len: usize,
    pf: usize,
) {
    let mut c = 0;
    while c + 64 <= len {
        // SAFETY: forwarded caller contract; c + 64 <= len.
        unsafe { axpy_multi_block::<T, H, 4>(w, w_stride, n_rows, rows, stride, acc, len, c, pf) };
        c += 64;
    }
    while c + 16 <= len {
        // SAFETY: forwarded caller contract; c + 16 <= len.
        unsafe { axpy_multi_block::<T, H, 1>(w, w_stride, n_rows, rows, stride, acc, len, c, pf) };
        c += 16;
    }
    for a in 0..H {
        for d in c..len {
            let mut s = acc[a * len + d];
            for j in 0..n_rows {
                s = w[a * w_stride + j].mul_add(rows[j * stride + d].widen(), s);
            }
            acc[a * len + d] = s;
        }
    }
}

/// # Safety
/// AVX-512F and FMA; `c + 16 * NV <= len`, `acc` holds `H` rows of `len`, `w` holds
/// `(H - 1) * w_stride + n_rows` floats and `rows` `(n_rows - 1) * stride + len`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn axpy_multi_block<T: KvElem, const H: usize, const NV: usize>(
    w: &[f32],
    w_stride: usize,
    n_rows: usize,
    rows: &[T],
    stride: usize,
    acc: &mut [f32],
    len: usize,
    c: usize,
    pf: usize,
) {
    use std::arch::x86_64::*;
    let mut r = [[_mm512_setzero_ps(); NV]; H];
    // SAFETY (this block): every access stays inside the extents in the contract above:
    // acc at a * len + c + 16 * t + 16 <= H * len, rows at j * stride + c + 16 * NV <=
    // (n_rows - 1) * stride + len, w at a * w_stride + j < (H - 1) * w_stride + n_rows.
    unsafe {
        for (a, r) in r.iter_mut().enumerate() {
            for (t, r) in r.iter_mut().enumerate() {
                *r = _mm512_loadu_ps(acc.as_ptr().add(a * len + c + 16 * t));
            }
        }
        for j in 0..n_rows {
            let base = rows.as_ptr().add(j * stride + c);
            if pf > 0 {
                let bytes = 16 * NV * std::mem::size_of::<T>();
                prefetch_lines(base.wrapping_add(pf * stride).cast(), bytes);
            }
            let mut v = [_mm512_setzero_ps(); NV];
            for (t, v) in v.iter_mut().enumerate() {
                *v = row16(base.add(16 * t));
            }
            for (a, r) in r.iter_mut().enumerate() {
                let wb = _mm512_set1_ps(*w.get_unchecked(a * w_stride + j));
                for (r, v) in r.iter_mut().zip(&v) {
                    *r = _mm512_fmadd_ps(wb, *v, *r);
                }
            }
        }
        for (a, r) in r.iter().enumerate() {
            for (t, r) in r.iter().enumerate() {
                _mm512_storeu_ps(acc.as_mut_ptr().add(a * len + c + 16 * t), *r);
            }
        }
    }
}

/// Prefetches the `bytes` from `at`, one hint per 64-byte step.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_lines(at: *const i8, bytes: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for t in 0..bytes.div_ceil(64) {
        // SAFETY: a prefetch is a hint that cannot fault, whatever the address (hence
        // the caller's `wrapping_add`).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * t)) }
    }
}
