//! Small f32 vector helpers with a fixed, documented reduction order, so a
//! value never depends on batch size, thread count or ISA. The attention's weighted
//! sums read V as the KV cache stores it (f32, or half floats widened exactly).

#[cfg(target_arch = "x86_64")]
use super::attn_tiles::{row16, row8};
use super::kv_elem::KvElem;
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
}
