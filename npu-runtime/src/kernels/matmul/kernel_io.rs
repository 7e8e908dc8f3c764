//! What the dispatcher hands an ISA kernel (`portable`, `x86_avx2`, `x86_avx512`): the
//! matrix and batch of one call ([`Kernel`]) and where its products go ([`Output`]).

use super::qmatrix::QMatrix;
use crate::kernels::ggml::GgmlType;
use crate::kernels::layout::{Planes, GROUP};

/// What a kernel needs for one call.
pub(crate) struct Kernel<'a> {
    pub ty: GgmlType,
    pub cols: usize,
    pub n_tokens: usize,
    pub planes: Planes,
    data: &'a [u8],
}

impl<'a> Kernel<'a> {
    /// The kernel for `w`'s repacked groups with `n_tokens` activation rows.
    pub fn new(w: &'a QMatrix, n_tokens: usize) -> Self {
        Kernel {
            ty: w.ty,
            cols: w.cols,
            n_tokens,
            planes: w.planes,
            data: w.bytes(),
        }
    }

    pub fn group(&self, g: usize) -> &'a [u8] {
        let gb = self.planes.group_bytes();
        &self.data[g * gb..(g + 1) * gb]
    }

    /// Start pointers of group `g`'s code, high-bit and scale planes (see `layout`).
    pub fn plane_ptrs(&self, g: usize) -> [*const u8; 3] {
        let group = self.group(g);
        let p = self.planes;
        [
            group.as_ptr(),
            group[p.codes..].as_ptr(),
            group[p.codes + p.high..].as_ptr(),
        ]
    }
}

/// Where and how a kernel writes its products `p[t][r]` (token t, row r < `rows`):
/// the kernels apply it with their own vector instructions right from the
/// accumulator register (one 64-byte store per full group on AVX-512), so there is
/// no callback, stack copy or `memcpy` call per (token, group). Every element gets
/// exactly the IEEE operation of the separate step (`p`, `p + bias[r]`, `out + p`),
/// so the bits are those of [`Epilogue`]'s definition.
#[derive(Clone, Copy)]
pub(crate) struct Output {
    /// Row 0 of token 0, `rows` floats per token (`Argmax`: the per-lane best values,
    /// `GROUP` per token).
    pub dst: *mut f32,
    /// Rows of the matrix: a last group with fewer is partial.
    pub rows: usize,
    pub op: OutOp,
}

#[derive(Clone, Copy)]
pub(crate) enum OutOp {
    /// `out = p`.
    Store,
    /// `out = p + bias[r]` (`rows` floats).
    Bias(*const f32),
    /// `out = out + p`.
    Accumulate,
    /// The argmax head's running per-lane maximum ([`lane_best`]): `dst`
    /// holds each token's `GROUP` best values, this pointer their `GROUP` groups.
    Argmax(*mut u32),
}

impl Output {
    /// Whether group `g` has all `GROUP` rows (only a last group may not).
    #[inline(always)]
    pub fn full(&self, g: usize) -> bool {
        g * GROUP + GROUP <= self.rows
    }

    /// Where token `t`'s group `g` goes.
    ///
    /// # Safety
    /// `t` and `g` are a token and group of the kernel call `self` was made for.
    #[inline(always)]
    pub unsafe fn at(&self, t: usize, g: usize) -> *mut f32 {
        let at = match self.op {
            OutOp::Argmax(_) => t * GROUP,
            _ => t * self.rows + g * GROUP,
        };
        // SAFETY: inside the output (the caller's contract and `run_groups`').
        unsafe { self.dst.add(at) }
    }

    /// Applies the output to token `t`'s group `g` from an array: the portable
    /// kernel's path and the SIMD kernels' path for a partial last group (whose
    /// rows past `rows` are dropped; for `Argmax` they are -inf, so never win).
    ///
    /// # Safety
    /// As [`Output::at`], and `self` addresses memory that only this task uses in
    /// group `g` (see `run_groups`).
    #[inline(never)]
    pub unsafe fn put(&self, t: usize, g: usize, acc: &[f32; GROUP]) {
        let r0 = g * GROUP;
        let n = GROUP.min(self.rows - r0);
        // SAFETY: (all) `at` is inside the output and the next `n` rows are this
        // group's (`GROUP` lanes for argmax); a bias holds `rows` floats.
        unsafe {
            let p = self.at(t, g);
            match self.op {
                OutOp::Store => {
                    for (i, &a) in acc[..n].iter().enumerate() {
                        *p.add(i) = a;
                    }
                }
                OutOp::Bias(b) => {
                    for (i, &a) in acc[..n].iter().enumerate() {
                        *p.add(i) = a + *b.add(r0 + i);
                    }
                }
                OutOp::Accumulate => {
                    for (i, &a) in acc[..n].iter().enumerate() {
                        *p.add(i) += a;
                    }
                }
                OutOp::Argmax(gi) => {
                    let mut a = [f32::NEG_INFINITY; GROUP];
                    a[..n].copy_from_slice(&acc[..n]);
                    let best = &mut *p.cast::<[f32; GROUP]>();
                    let group = &mut *gi.add(t * GROUP).cast::<[u32; GROUP]>();
                    lane_best(best, group, &a, g as u32);
                }
            }
        }
    }
}

/// Running per-lane maximum for the argmax LM head: where `acc[i] > best[i]`
/// (false for NaN), `best[i] = acc[i]` and `group[i] = g`. Visiting groups in
/// ascending order keeps each lane's first (lowest-row) maximum.
pub(crate) fn lane_best(
    best: &mut [f32; GROUP],
    group: &mut [u32; GROUP],
    acc: &[f32; GROUP],
    g: u32,
) {
    for i in 0..GROUP {
        if acc[i] > best[i] {
            best[i] = acc[i];
            group[i] = g;
        }
    }
}
