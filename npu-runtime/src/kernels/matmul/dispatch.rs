//! What every matmul entry point shares: the scratch buffers, the argument checks, the
//! quantization of the input and its split into pool tasks, and the dispatch of a range of
//! row groups to the kernel of the chosen ISA.

use super::kernel_io::{Kernel, Output};
use super::qmatrix::QMatrix;
use crate::kernels::act::{quantize_parallel, ActFormat, QuantActs};
use crate::kernels::ggml::GgmlType;
use crate::kernels::layout::GROUP;
use crate::kernels::pool::ThreadPool;
use crate::kernels::portable;
use crate::kernels::simd::Isa;
use std::sync::atomic::AtomicU64;

/// Buffers `matmul` needs (quantized activations), sized once for the
/// largest call so `matmul` never allocates.
///
/// One quantized copy per activation format, so [`matmul_multi`] can quantize a
/// shared input once per format its matrices need (untouched copies stay
/// unmapped zero pages).
pub struct MatmulScratch {
    pub(super) max_tokens: usize,
    pub(super) max_cols: usize,
    pub(super) acts: [QuantActs; ActFormat::COUNT],
    /// Per token, the best (logit, row) found so far by [`matmul_argmax`] tasks.
    pub(super) best: Vec<AtomicU64>,
}

impl MatmulScratch {
    pub fn new(max_tokens: usize, max_cols: usize) -> Self {
        MatmulScratch {
            max_tokens,
            max_cols,
            acts: std::array::from_fn(|_| QuantActs::new(max_tokens, max_cols)),
            best: (0..max_tokens).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl MatmulScratch {
    /// The quantized activations for weights of type `ty`, as the last call that
    /// needed them left them.
    pub(crate) fn acts_for(&self, ty: GgmlType) -> &QuantActs {
        &self.acts[ActFormat::for_weights(ty).index()]
    }
}

pub(super) fn check_args(w: &QMatrix, x: &[f32], n_tokens: usize, out: &[f32]) {
    assert_eq!(
        x.len(),
        n_tokens * w.cols,
        "matmul: x must be n_tokens x cols"
    );
    assert_eq!(
        out.len(),
        n_tokens * w.rows,
        "matmul: out must be n_tokens x rows"
    );
}

/// Most matrices one [`matmul_multi`] call takes.
pub const MAX_MULTI: usize = 4;

/// Checks the scratch, quantizes `x` once per activation format `ws` need and
/// splits the work into pool tasks: returns the ISA to run and the task count per
/// matrix and whether to use the pool (not for calls too small to pay for a
/// hand-off: one task per matrix, inline), or `None` for an empty batch.
pub(super) fn prepare(
    isa: Isa,
    ws: &[&QMatrix],
    x: &[f32],
    n_tokens: usize,
    scratch: &mut MatmulScratch,
    pool: &ThreadPool,
) -> Option<(Isa, [usize; MAX_MULTI], bool)> {
    for w in ws {
        assert!(
            n_tokens <= scratch.max_tokens && w.cols <= scratch.max_cols,
            "matmul: scratch planned for {}x{}, call needs {}x{}",
            scratch.max_tokens,
            scratch.max_cols,
            n_tokens,
            w.cols
        );
    }
    if n_tokens == 0 {
        return None;
    }
    let isa = if isa.is_supported() {
        isa
    } else {
        Isa::Portable
    };
    // Quantize the input once per activation format the matrices need.
    let mut quantized = [false; ActFormat::COUNT];
    for w in ws {
        if matches!(w.ty, GgmlType::F32 | GgmlType::F16) {
            continue;
        }
        let fmt = ActFormat::for_weights(w.ty);
        if !quantized[fmt.index()] {
            quantize_parallel(isa, fmt, x, &mut scratch.acts[fmt.index()], pool);
            quantized[fmt.index()] = true;
        }
    }
    // Tasks per matrix in proportion to its work (at least one, at most one per
    // row group); tiny calls run in one task without a pool hand-off.
    let work: [usize; MAX_MULTI] =
        std::array::from_fn(|i| ws.get(i).map_or(0, |w| w.rows * w.cols * n_tokens));
    let total: usize = work.iter().sum();
    let budget = if total < 1 << 16 {
        0
    } else {
        4 * pool.n_threads()
    };
    let tasks: [usize; MAX_MULTI] = std::array::from_fn(|i| match ws.get(i) {
        Some(w) if budget > 0 => (budget * work[i])
            .div_ceil(total)
            .clamp(1, w.rows.div_ceil(GROUP)),
        Some(_) => 1,
        None => 0,
    });
    Some((isa, tasks, budget > 0))
}

/// Task `j`'s share `g0..g1` of `n_groups` row groups split into `n_tasks` near-even
/// shares. Cuts fall on even groups: the pair kernels compute two groups per pass, and a
/// share ending in a lone group would run it in the single-group pass (slower per row).
pub(super) fn task_groups(j: usize, n_groups: usize, n_tasks: usize) -> (usize, usize) {
    let cut = |i: usize| {
        if i >= n_tasks {
            n_groups
        } else {
            (i * n_groups / n_tasks) & !1
        }
    };
    (cut(j), cut(j + 1))
}

/// Runs the kernel of `isa` on groups `g0..g1`, writing through `out`.
///
/// # Safety
/// `isa` is supported; `out` is valid for the call's tokens and groups `g0..g1`
/// and nobody else uses those parts of it during the call (see [`Output::put`]).
pub(super) unsafe fn run_isa(
    isa: Isa,
    k: &Kernel,
    acts: &QuantActs,
    x: &[f32],
    g0: usize,
    g1: usize,
    out: &Output,
) {
    // SAFETY (all arms): the caller's contract; the activations were quantized for
    // this call's tokens and columns.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => crate::kernels::x86_avx512::run(k, acts, x, g0, g1, out),
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => crate::kernels::x86_avx2::run_vnni(k, acts, x, g0, g1, out),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => crate::kernels::x86_avx2::run(k, acts, x, g0, g1, out),
            _ => portable::run(k, acts, x, g0, g1, out),
        }
    }
}

/// A raw output pointer shared by pool tasks that write disjoint elements.
#[derive(Clone, Copy)]
pub(super) struct SendPtr(pub(super) *mut f32);
// SAFETY: only used to write disjoint output ranges from pool tasks (see `write`).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}
impl SendPtr {
    pub(super) fn get(self) -> *mut f32 {
        self.0
    }
}
