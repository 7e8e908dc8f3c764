//! Register-blocked, multithreaded f32 GEMM for dense layers fed many rows at once (the BERT
//! encoder): `C[m, n] = A[m, k] · Wᵀ (+ bias)` with `W` in PyTorch `[n, k]` layout.
//!
//! `W` is repacked once into panels of [`NR`] output features (`[k][NR]`, zero-padded), and
//! each task packs its block of `A` rows into `[k][MR]` micro-panels, so the micro-kernel
//! streams both operands contiguously while an `MR x (NR or 2·NR)` tile of `C` stays in
//! registers: 12 x 32 (24 zmm accumulators) on AVX-512, 6 x 16 (12 ymm) on AVX2+FMA.
//!
//! Numerics: every `C[i][j]` is one fused multiply-add chain over `k` in ascending order
//! starting from +0.0, with the bias added last. That is exactly what the scalar reference
//! computes with `f32::mul_add`, so every ISA, tile position, batch size and thread count
//! gives the same bits.

use super::pool::ThreadPool;
use super::simd::{detected, Isa};
use std::sync::Mutex;

/// Output features per packed panel (one zmm of f32).
pub const NR: usize = 16;
/// Rows per register tile on AVX-512 (and the row stride of packed `A`).
const MR_512: usize = 12;
/// Rows per register tile on AVX2.
const MR_256: usize = 6;
/// Row tiles per task on the same panels (reuse of each `W` panel from L2).
const TILES_PER_TASK: usize = 4;
/// Rows of packed `A` a task holds at most.
const MC: usize = MR_512 * TILES_PER_TASK;

/// The code path [`gemm_f32`] takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmIsa {
    /// AVX-512F with FMA.
    Avx512,
    /// AVX2 with FMA.
    Avx2Fma,
    /// Plain Rust (`f32::mul_add`).
    Scalar,
}

impl GemmIsa {
    /// Whether this CPU can run `self`.
    pub fn is_supported(self) -> bool {
        match self {
            GemmIsa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            GemmIsa::Avx2Fma => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            GemmIsa::Avx512 => {
                GemmIsa::Avx2Fma.is_supported() && is_x86_feature_detected!("avx512f")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every path this CPU supports, best first.
    pub fn available() -> Vec<GemmIsa> {
        [GemmIsa::Avx512, GemmIsa::Avx2Fma, GemmIsa::Scalar]
            .into_iter()
            .filter(|i| i.is_supported())
            .collect()
    }

    /// The best supported path, capped by the kernels' [`detected`] ISA (so `RAG_ISA=avx2`
    /// or `portable` also governs this GEMM).
    pub fn detect() -> GemmIsa {
        let cap = match detected() {
            Isa::Avx512Vnni => GemmIsa::Avx512,
            Isa::Avx2 | Isa::AvxVnni => GemmIsa::Avx2Fma,
            Isa::Portable => GemmIsa::Scalar,
        };
        GemmIsa::available()
            .into_iter()
            .find(|&i| i as u8 >= cap as u8)
            .unwrap_or(GemmIsa::Scalar)
    }

    fn mr(self) -> usize {
        match self {
            GemmIsa::Avx512 => MR_512,
            GemmIsa::Avx2Fma | GemmIsa::Scalar => MR_256,
        }
    }
}

/// A weight matrix `[n, k]` repacked into `ceil(n / NR)` panels of `k * NR` floats.
#[derive(Debug, Clone)]
pub struct PackedF32 {
    n: usize,
    k: usize,
    panels: Vec<f32>,
}

impl PackedF32 {
    /// Packs a row-major `[n, k]` weight. Panics if `weight.len() != n * k`.
    pub fn new(weight: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(weight.len(), n * k, "weight is not [n, k]");
        let n_panels = n.div_ceil(NR);
        let mut panels = vec![0.0f32; n_panels * k * NR];
        if k > 0 {
            for (p, panel) in panels.chunks_exact_mut(k * NR).enumerate() {
                for j in 0..NR.min(n - p * NR) {
                    let row = &weight[(p * NR + j) * k..][..k];
                    for (kk, &w) in row.iter().enumerate() {
                        panel[kk * NR + j] = w;
                    }
                }
            }
        }
        PackedF32 { n, k, panels }
    }

    /// Output features.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input features.
    pub fn k(&self) -> usize {
        self.k
    }

    fn n_panels(&self) -> usize {
        self.n.div_ceil(NR)
    }

    fn panel(&self, p: usize) -> &[f32] {
        &self.panels[p * self.k * NR..(p + 1) * self.k * NR]
    }
}

/// Per-thread buffers for packed `A`, planned once for a pool and the widest `k`.
pub struct GemmScratch {
    k: usize,
    free: Mutex<Vec<Vec<f32>>>,
    slots: usize,
}

impl GemmScratch {
    /// Buffers for `threads` concurrent tasks of up to `max_k` input features.
    pub fn new(threads: usize, max_k: usize) -> Self {
        let slots = threads.max(1);
        GemmScratch {
            k: max_k,
            free: Mutex::new((0..slots).map(|_| vec![0.0; MC * max_k]).collect()),
            slots,
        }
    }

    /// Whether calls on a pool of `threads` with `k` input features fit this scratch.
    pub fn fits(&self, threads: usize, k: usize) -> bool {
        threads <= self.slots && k <= self.k
    }
}

/// Scalar oracle on the unpacked `[n, k]` weight: one `mul_add` chain per element over `k`
/// ascending from +0.0, bias added last.
pub fn gemm_f32_reference(
    weight: &[f32],
    bias: Option<&[f32]>,
    a: &[f32],
    m: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
) {
    assert_eq!(weight.len(), n * k);
    assert_eq!(a.len(), m * k);
    assert_eq!(c.len(), m * n);
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f32;
            for kk in 0..k {
                s = a[i * k + kk].mul_add(weight[j * k + kk], s);
            }
            c[i * n + j] = match bias {
                Some(b) => s + b[j],
                None => s,
            };
        }
    }
}

/// `C = A · Wᵀ (+ bias)` on the best path for this CPU ([`GemmIsa::detect`]).
pub fn gemm_f32(
    w: &PackedF32,
    bias: Option<&[f32]>,
    a: &[f32],
    m: usize,
    c: &mut [f32],
    scratch: &GemmScratch,
    pool: &ThreadPool,
) {
    gemm_f32_with_isa(GemmIsa::detect(), w, bias, a, m, c, scratch, pool)
}

/// [`gemm_f32`] on a given path (the scalar one if this CPU lacks it). `a` is `[m, k]`, `c`
/// is `[m, n]`; panics on shape mismatches or a scratch planned for fewer threads or a
/// narrower `k` than the call needs.
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32_with_isa(
    isa: GemmIsa,
    w: &PackedF32,
    bias: Option<&[f32]>,
    a: &[f32],
    m: usize,
    c: &mut [f32],
    scratch: &GemmScratch,
    pool: &ThreadPool,
) {
    let (n, k) = (w.n, w.k);
    assert_eq!(a.len(), m * k, "gemm_f32: a is not [m, k]");
    assert_eq!(c.len(), m * n, "gemm_f32: c is not [m, n]");
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "gemm_f32: bias is not [n]");
    }
    assert!(
        k <= scratch.k && pool.n_threads() <= scratch.slots,
        "gemm_f32: scratch planned for k {} x {} threads, call needs k {} x {}",
        scratch.k,
        scratch.slots,
        k,
        pool.n_threads()
    );
    if m == 0 || n == 0 {
        return;
    }
    let isa = if isa.is_supported() {
        isa
    } else {
        GemmIsa::Scalar
    };
    let mc = isa.mr() * TILES_PER_TASK;
    let row_blocks = m.div_ceil(mc);
    // Panel pairs are the AVX-512 unit; split them over tasks when rows alone cannot keep
    // every thread busy (short queries).
    let units = w.n_panels().div_ceil(2);
    let col_blocks = (2 * pool.n_threads()).div_ceil(row_blocks).clamp(1, units);
    let tasks = row_blocks * col_blocks;
    let c_ptr = SendPtr(c.as_mut_ptr());
    pool.parallel_for(tasks, &|t| {
        let (rb, cb) = (t / col_blocks, t % col_blocks);
        let r0 = rb * mc;
        let rows = mc.min(m - r0);
        let p0 = 2 * (cb * units / col_blocks);
        let p1 = (2 * ((cb + 1) * units / col_blocks)).min(w.n_panels());
        let mut buf = scratch
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .expect("gemm_f32: more concurrent tasks than scratch slots");
        let out = Out {
            ptr: c_ptr,
            ldc: n,
            row0: r0,
        };
        run_block(
            isa,
            w,
            bias,
            &a[r0 * k..(r0 + rows) * k],
            rows,
            p0,
            p1,
            &mut buf,
            &out,
        );
        scratch
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(buf);
    });
}

/// Where a task writes: rows `row0..` of `C` (row stride `ldc`).
struct Out {
    ptr: SendPtr,
    ldc: usize,
    row0: usize,
}

impl Out {
    /// Stores `vals` at `C[row0 + i][j0..j0 + vals.len()]`.
    fn store(&self, i: usize, j0: usize, vals: &[f32]) {
        debug_assert!(j0 + vals.len() <= self.ldc);
        // SAFETY: `gemm_f32_with_isa` checked `c.len() == m * n`; tasks only pass rows below
        // `m` and columns `j0 + len <= n`, and each (row block, panel range) belongs to exactly
        // one task, so writes from different threads never overlap while `c` is exclusively
        // borrowed by the call.
        unsafe {
            let dst = self.ptr.0.add((self.row0 + i) * self.ldc + j0);
            std::ptr::copy_nonoverlapping(vals.as_ptr(), dst, vals.len());
        }
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: only used for disjoint writes from pool tasks (see `Out::store`).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

/// Rows `a` (`rows <= mc`) against panels `p0..p1`.
#[allow(clippy::too_many_arguments)]
fn run_block(
    isa: GemmIsa,
    w: &PackedF32,
    bias: Option<&[f32]>,
    a: &[f32],
    rows: usize,
    p0: usize,
    p1: usize,
    buf: &mut [f32],
    out: &Out,
) {
    let k = w.k;
    let mr = isa.mr();
    // Pack A: tile t holds rows t*mr.. as [k][mr] (rows past `rows` are never read).
    for (t, tile) in buf[..rows.div_ceil(mr) * mr * k]
        .chunks_exact_mut(mr * k)
        .enumerate()
    {
        let tr = mr.min(rows - t * mr);
        for i in 0..tr {
            let src = &a[(t * mr + i) * k..][..k];
            for (kk, &v) in src.iter().enumerate() {
                tile[kk * mr + i] = v;
            }
        }
    }
    let mut p = p0;
    while p < p1 {
        let pair = isa == GemmIsa::Avx512 && p + 1 < p1;
        let np = if pair { 2 } else { 1 };
        for t in 0..rows.div_ceil(mr) {
            let tr = mr.min(rows - t * mr);
            let tile = &buf[t * mr * k..(t + 1) * mr * k];
            let mut acc = [[0.0f32; 2 * NR]; MR_512];
            micro(
                isa,
                tile,
                w.panel(p),
                pair.then(|| w.panel(p + 1)),
                k,
                tr,
                &mut acc,
            );
            let j0 = p * NR;
            let width = (np * NR).min(w.n - j0);
            for (i, row) in acc[..tr].iter_mut().enumerate() {
                if let Some(b) = bias {
                    for (v, b) in row[..width].iter_mut().zip(&b[j0..]) {
                        *v += b;
                    }
                }
                out.store(t * mr + i, j0, &row[..width]);
            }
        }
        p += np;
    }
}

/// `tr` rows of the packed `tile` against panel `p0` (and `p1` on AVX-512) into `acc`.
fn micro(
    isa: GemmIsa,
    tile: &[f32],
    p0: &[f32],
    p1: Option<&[f32]>,
    k: usize,
    tr: usize,
    acc: &mut [[f32; 2 * NR]; MR_512],
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: callers only pass a supported ISA (checked with `is_supported`); the
        // micro-kernel asserts the operand lengths it reads.
        GemmIsa::Avx512 => unsafe { avx512::tile(tile, p0, p1, k, tr, acc) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2+FMA.
        GemmIsa::Avx2Fma => unsafe { avx2::tile(tile, p0, k, tr, acc) },
        _ => scalar_tile(tile, p0, k, isa.mr(), tr, acc),
    }
}

/// The second operand of [`gemm_f32_serial`]: `n` output features by `k` inputs.
#[derive(Clone, Copy)]
pub enum BOperand<'a> {
    /// Feature `j` is the row `b[j * ld..][..k]` (a weight, or the keys of `Q·Kᵀ`).
    Rows { b: &'a [f32], ld: usize },
    /// Feature `j` is the column `b[kk * ld + j]` (the values of `P·V`).
    Cols { b: &'a [f32], ld: usize },
}

/// Single-threaded `C[i][j] = Σ_kk A[i][kk] · B(j, kk)` on strided operands, for many small
/// products run from inside a pool task (attention per sequence and head). `a` row `i` is
/// `a[i * lda..][..k]`, `c` row `i` is `c[i * ldc..][..n]`; `buf` holds the packed operands
/// and grows once to the largest call. Same numerics as [`gemm_f32`].
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32_serial(
    isa: GemmIsa,
    a: &[f32],
    lda: usize,
    m: usize,
    b: BOperand,
    n: usize,
    k: usize,
    c: &mut [f32],
    ldc: usize,
    buf: &mut Vec<f32>,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(lda >= k && ldc >= n, "gemm_f32_serial: strides too small");
    assert!(a.len() >= (m - 1) * lda + k, "gemm_f32_serial: a too short");
    assert!(c.len() >= (m - 1) * ldc + n, "gemm_f32_serial: c too short");
    let isa = if isa.is_supported() {
        isa
    } else {
        GemmIsa::Scalar
    };
    let mr = isa.mr();
    let n_panels = n.div_ceil(NR);
    let b_len = n_panels * k * NR;
    if buf.len() < b_len + mr * k {
        buf.resize(b_len + mr * k, 0.0);
    }
    let (panels, tile) = buf.split_at_mut(b_len);
    let tile = &mut tile[..mr * k];
    if k > 0 {
        match b {
            BOperand::Rows { b, ld } => {
                assert!(ld >= k && b.len() >= (n - 1) * ld + k, "gemm_f32_serial: b");
                for (p, panel) in panels.chunks_exact_mut(k * NR).enumerate() {
                    let width = NR.min(n - p * NR);
                    for j in 0..NR {
                        if j < width {
                            let row = &b[(p * NR + j) * ld..][..k];
                            for (kk, &v) in row.iter().enumerate() {
                                panel[kk * NR + j] = v;
                            }
                        } else {
                            for kk in 0..k {
                                panel[kk * NR + j] = 0.0;
                            }
                        }
                    }
                }
            }
            BOperand::Cols { b, ld } => {
                assert!(ld >= n && b.len() >= (k - 1) * ld + n, "gemm_f32_serial: b");
                for (p, panel) in panels.chunks_exact_mut(k * NR).enumerate() {
                    let width = NR.min(n - p * NR);
                    for (kk, dst) in panel.chunks_exact_mut(NR).enumerate() {
                        dst[..width].copy_from_slice(&b[kk * ld + p * NR..][..width]);
                        dst[width..].fill(0.0);
                    }
                }
            }
        }
    }
    let panels = &*panels;
    let panel = |p: usize| &panels[p * k * NR..(p + 1) * k * NR];
    for t in 0..m.div_ceil(mr) {
        let tr = mr.min(m - t * mr);
        for i in 0..tr {
            let src = &a[(t * mr + i) * lda..][..k];
            for (kk, &v) in src.iter().enumerate() {
                tile[kk * mr + i] = v;
            }
        }
        let mut p = 0;
        while p < n_panels {
            let pair = isa == GemmIsa::Avx512 && p + 1 < n_panels;
            let mut acc = [[0.0f32; 2 * NR]; MR_512];
            micro(
                isa,
                tile,
                panel(p),
                pair.then(|| panel(p + 1)),
                k,
                tr,
                &mut acc,
            );
            let j0 = p * NR;
            let width = (if pair { 2 * NR } else { NR }).min(n - j0);
            for (i, row) in acc[..tr].iter().enumerate() {
                c[(t * mr + i) * ldc + j0..][..width].copy_from_slice(&row[..width]);
            }
            p += if pair { 2 } else { 1 };
        }
    }
}

/// Portable tile: the same per-element `mul_add` chain.
fn scalar_tile(
    tile: &[f32],
    panel: &[f32],
    k: usize,
    mr: usize,
    rows: usize,
    acc: &mut [[f32; 2 * NR]; MR_512],
) {
    for kk in 0..k {
        let wv = &panel[kk * NR..(kk + 1) * NR];
        for (i, row) in acc[..rows].iter_mut().enumerate() {
            let x = tile[kk * mr + i];
            for (o, &wj) in row[..NR].iter_mut().zip(wv) {
                *o = x.mul_add(wj, *o);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{MR_512, NR};
    use std::arch::x86_64::*;

    /// `rows` (<= 12) rows of packed `tile` against one or two panels into `acc`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F and FMA.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn tile(
        tile: &[f32],
        p0: &[f32],
        p1: Option<&[f32]>,
        k: usize,
        rows: usize,
        acc: &mut [[f32; 2 * NR]; MR_512],
    ) {
        assert!(tile.len() >= k * MR_512 && p0.len() >= k * NR && rows <= MR_512);
        if let Some(p1) = p1 {
            assert!(p1.len() >= k * NR);
        }
        macro_rules! go {
            ($($m:literal)*) => {
                match (rows, p1) {
                    $( ($m, Some(p1)) => kernel::<$m, 2>(tile, [p0, p1], k, acc), )*
                    $( ($m, None) => kernel::<$m, 1>(tile, [p0, p0], k, acc), )*
                    _ => {}
                }
            };
        }
        go!(1 2 3 4 5 6 7 8 9 10 11 12);
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn kernel<const M: usize, const P: usize>(
        tile: &[f32],
        panels: [&[f32]; 2],
        k: usize,
        acc: &mut [[f32; 2 * NR]; MR_512],
    ) {
        let mut c = [[_mm512_setzero_ps(); P]; M];
        let a = tile.as_ptr();
        let b = [panels[0].as_ptr(), panels[1].as_ptr()];
        for kk in 0..k {
            // SAFETY: kk < k, and the caller asserted the tile holds k*MR_512 floats and
            // each panel k*NR.
            let wv: [__m512; P] = std::array::from_fn(|p| _mm512_loadu_ps(b[p].add(kk * NR)));
            for (i, ci) in c.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*a.add(kk * MR_512 + i));
                for (cp, wp) in ci.iter_mut().zip(&wv) {
                    *cp = _mm512_fmadd_ps(x, *wp, *cp);
                }
            }
        }
        for (ci, out) in c.iter().zip(acc.iter_mut()) {
            for (p, cp) in ci.iter().enumerate() {
                // SAFETY: out has 2*NR floats and p < P <= 2, so p*NR + 16 <= 2*NR.
                _mm512_storeu_ps(out.as_mut_ptr().add(p * NR), *cp);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{MR_256, MR_512, NR};
    use std::arch::x86_64::*;

    /// `rows` (<= 6) rows of packed `tile` against one panel into `acc`.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile(
        tile: &[f32],
        p0: &[f32],
        k: usize,
        rows: usize,
        acc: &mut [[f32; 2 * NR]; MR_512],
    ) {
        assert!(tile.len() >= k * MR_256 && p0.len() >= k * NR && rows <= MR_256);
        match rows {
            1 => kernel::<1>(tile, p0, k, acc),
            2 => kernel::<2>(tile, p0, k, acc),
            3 => kernel::<3>(tile, p0, k, acc),
            4 => kernel::<4>(tile, p0, k, acc),
            5 => kernel::<5>(tile, p0, k, acc),
            6 => kernel::<6>(tile, p0, k, acc),
            _ => {}
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn kernel<const M: usize>(
        tile: &[f32],
        panel: &[f32],
        k: usize,
        acc: &mut [[f32; 2 * NR]; MR_512],
    ) {
        let mut c = [[_mm256_setzero_ps(); 2]; M];
        let a = tile.as_ptr();
        let b = panel.as_ptr();
        for kk in 0..k {
            // SAFETY: kk < k; the caller asserted the tile holds k*MR_256 floats and the
            // panel k*NR.
            let w0 = _mm256_loadu_ps(b.add(kk * NR));
            let w1 = _mm256_loadu_ps(b.add(kk * NR + 8));
            for (i, ci) in c.iter_mut().enumerate() {
                let x = _mm256_set1_ps(*a.add(kk * MR_256 + i));
                ci[0] = _mm256_fmadd_ps(x, w0, ci[0]);
                ci[1] = _mm256_fmadd_ps(x, w1, ci[1]);
            }
        }
        for (ci, out) in c.iter().zip(acc.iter_mut()) {
            // SAFETY: out has 2*NR >= 16 floats.
            _mm256_storeu_ps(out.as_mut_ptr(), ci[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), ci[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(seed: u64, len: usize) -> Vec<f32> {
        crate::test_rng::uniform(&mut (seed ^ 0x9e37_79b9_7f4a_7c15), len)
    }

    fn run(isa: GemmIsa, threads: usize, m: usize, n: usize, k: usize, seed: u64, bias: bool) {
        let w = values(seed, n * k);
        let b = values(seed + 1, n);
        let a = values(seed + 2, m * k);
        let bias = bias.then_some(b.as_slice());
        let mut want = vec![0.0; m * n];
        gemm_f32_reference(&w, bias, &a, m, n, k, &mut want);
        let packed = PackedF32::new(&w, n, k);
        let pool = ThreadPool::new(threads);
        let scratch = GemmScratch::new(threads, k);
        let mut got = vec![f32::NAN; m * n];
        gemm_f32_with_isa(isa, &packed, bias, &a, m, &mut got, &scratch, &pool);
        for (idx, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{isa:?} threads {threads} m {m} n {n} k {k}: element {idx}: {g} vs {w}"
            );
        }
    }

    #[test]
    fn every_isa_matches_the_scalar_reference_bit_for_bit() {
        let mut rng = 12345u64;
        let mut next = |hi: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            1 + (rng % hi as u64) as usize
        };
        for isa in GemmIsa::available() {
            for &(m, n, k) in &[
                (1, 1, 1),
                (12, 32, 8),
                (13, 33, 7),
                (49, 48, 40),
                (5, 1152, 3),
            ] {
                run(isa, 2, m, n, k, (m * n * k) as u64, true);
            }
            for case in 0..40 {
                let (m, n, k) = (next(100), next(90), next(70));
                run(isa, 1 + case % 3, m, n, k, case as u64, case % 2 == 0);
            }
        }
    }

    #[test]
    fn serial_strided_products_match_the_reference() {
        let mut buf = Vec::new();
        for isa in GemmIsa::available() {
            for (case, &(m, n, k)) in [(1, 1, 1), (7, 37, 32), (30, 32, 45), (13, 50, 3)]
                .iter()
                .enumerate()
            {
                let (lda, ldb, ldc) = (k + 3, k.max(n) + 5, n + 2);
                let a = values(case as u64, m * lda);
                let braw = values(case as u64 + 9, n.max(k) * ldb);
                // Rows: feature j is braw[j*ldb..][..k]; Cols: feature j is braw[kk*ldb + j].
                let rows_w: Vec<f32> = (0..n).flat_map(|j| braw[j * ldb..][..k].to_vec()).collect();
                let cols_w: Vec<f32> = (0..n)
                    .flat_map(|j| (0..k).map(|kk| braw[kk * ldb + j]).collect::<Vec<_>>())
                    .collect();
                let a_dense: Vec<f32> = (0..m).flat_map(|i| a[i * lda..][..k].to_vec()).collect();
                for (b, w) in [
                    (BOperand::Rows { b: &braw, ld: ldb }, &rows_w),
                    (BOperand::Cols { b: &braw, ld: ldb }, &cols_w),
                ] {
                    let mut want = vec![0.0; m * n];
                    gemm_f32_reference(w, None, &a_dense, m, n, k, &mut want);
                    let mut c = vec![f32::NAN; m * ldc];
                    gemm_f32_serial(isa, &a, lda, m, b, n, k, &mut c, ldc, &mut buf);
                    for i in 0..m {
                        for j in 0..n {
                            assert_eq!(
                                c[i * ldc + j].to_bits(),
                                want[i * n + j].to_bits(),
                                "{isa:?} m {m} n {n} k {k} ({i}, {j})"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn rows_do_not_depend_on_the_batch() {
        let (n, k) = (40, 24);
        let w = PackedF32::new(&values(1, n * k), n, k);
        let b = values(2, n);
        let a = values(3, 29 * k);
        let pool = ThreadPool::new(2);
        let scratch = GemmScratch::new(2, k);
        let mut all = vec![0.0; 29 * n];
        gemm_f32(&w, Some(&b), &a, 29, &mut all, &scratch, &pool);
        for r in 0..29 {
            let mut one = vec![0.0; n];
            gemm_f32(
                &w,
                Some(&b),
                &a[r * k..(r + 1) * k],
                1,
                &mut one,
                &scratch,
                &pool,
            );
            assert_eq!(one, all[r * n..(r + 1) * n], "row {r}");
        }
    }

    #[test]
    fn empty_calls_are_no_ops() {
        let w = PackedF32::new(&values(1, 8 * 4), 8, 4);
        let pool = ThreadPool::new(1);
        let scratch = GemmScratch::new(1, 4);
        gemm_f32(&w, None, &[], 0, &mut [], &scratch, &pool);
        assert!(GemmIsa::detect().is_supported());
    }
}
