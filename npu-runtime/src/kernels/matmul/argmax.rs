//! The argmax-only LM head: each token's largest output row without writing the products.

use super::dispatch::{prepare, run_isa, task_groups, MatmulScratch};
use super::kernel_io::{Kernel, OutOp, Output};
use super::qmatrix::QMatrix;
use crate::kernels::act::ActFormat;
use crate::kernels::ggml::GgmlType;
use crate::kernels::layout::GROUP;
use crate::kernels::pool::ThreadPool;
use crate::kernels::simd::{detected, Isa};
use std::sync::atomic::{AtomicU64, Ordering};

/// Most tokens one [`matmul_argmax`] call takes (each task keeps a running
/// best per token and lane on its stack).
pub const ARGMAX_MAX_TOKENS: usize = 64;

/// `out[n] = argmax_r (x · Wᵀ)[n][r]` without materialising the products: the
/// index of each token's largest output, ties to the lowest row, NaN never
/// winning (an all-NaN or all -inf token gives 0), exactly what a scan of the
/// full [`matmul`] output with `>` from `-inf` returns. For an LM head whose
/// logits are only needed for their argmax (verification), this skips writing
/// `n_tokens × rows` floats.
pub fn matmul_argmax(
    w: &QMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [u32],
    scratch: &mut MatmulScratch,
    pool: &ThreadPool,
) {
    matmul_argmax_with_isa(detected(), w, x, n_tokens, out, scratch, pool)
}

/// Per token and lane (row within a group): the largest output seen and its group.
struct LaneBest {
    v: [[f32; GROUP]; ARGMAX_MAX_TOKENS],
    g: [[u32; GROUP]; ARGMAX_MAX_TOKENS],
}

impl LaneBest {
    fn new() -> Self {
        LaneBest {
            v: [[f32::NEG_INFINITY; GROUP]; ARGMAX_MAX_TOKENS],
            g: [[0; GROUP]; ARGMAX_MAX_TOKENS],
        }
    }

    /// Token `t`'s best (value, row) over the lanes, ties to the lowest row; `None`
    /// if no lane saw a value above -inf.
    fn winner(&self, t: usize) -> Option<(f32, usize)> {
        let (mut bv, mut brow) = (f32::NEG_INFINITY, usize::MAX);
        for i in 0..GROUP {
            let (v, row) = (self.v[t][i], self.g[t][i] as usize * GROUP + i);
            if v > bv || (v == bv && v > f32::NEG_INFINITY && row < brow) {
                (bv, brow) = (v, row);
            }
        }
        (bv > f32::NEG_INFINITY).then_some((bv, brow))
    }

    /// The write target of the argmax kernels for `rows` rows.
    fn output(&mut self, rows: usize) -> Output {
        Output {
            dst: self.v.as_mut_ptr().cast(),
            rows,
            op: OutOp::Argmax(self.g.as_mut_ptr().cast()),
        }
    }
}

/// [`matmul_argmax`] over the rows of row groups `groups` (ascending, each
/// `< rows.div_ceil(16)`) only: token `n`'s index is that of its largest output among
/// those rows, ties to the lowest row, NaN never winning, 0 if none is above -inf.
/// Each row's output is the bit pattern [`matmul`] gives it, so when `groups` hold
/// every row that could be a token's maximum the result is [`matmul_argmax`]'s (the
/// screened LM head, `screen`). Many groups are split over the pool.
#[allow(clippy::too_many_arguments)]
pub(crate) fn argmax_in_groups(
    isa: Isa,
    w: &QMatrix,
    x: &[f32],
    n_tokens: usize,
    groups: &[u32],
    out: &mut [u32],
    scratch: &mut MatmulScratch,
    pool: &ThreadPool,
) {
    assert!(
        n_tokens <= ARGMAX_MAX_TOKENS.min(scratch.max_tokens)
            && w.cols <= scratch.max_cols
            && x.len() == n_tokens * w.cols
            && out.len() == n_tokens,
        "argmax_in_groups: bad shapes"
    );
    let n_groups = w.rows.div_ceil(GROUP);
    assert!(
        groups.windows(2).all(|p| p[0] < p[1]) && groups.iter().all(|&g| (g as usize) < n_groups),
        "argmax_in_groups: groups must ascend and exist"
    );
    let isa = if isa.is_supported() {
        isa
    } else {
        Isa::Portable
    };
    let fmt = ActFormat::for_weights(w.ty);
    if !matches!(w.ty, GgmlType::F32 | GgmlType::F16) {
        crate::kernels::act::quantize(isa, fmt, x, &mut scratch.acts[fmt.index()]);
    }
    for b in &scratch.best[..n_tokens] {
        b.store(0, Ordering::Relaxed);
    }
    let (a, best) = (&scratch.acts[fmt.index()], &scratch.best);
    // A group is ~15 KB of a 1k-wide Q8_0 head: a pool hand-off (~1-2 us) pays from a
    // few dozen groups on.
    let tasks = if groups.len() >= 32 {
        pool.n_threads()
    } else {
        1
    };
    let run_part = |j: usize| {
        let part = &groups[j * groups.len() / tasks..(j + 1) * groups.len() / tasks];
        let k = Kernel::new(w, n_tokens);
        let mut l = LaneBest::new();
        let o = l.output(w.rows);
        for &g in part {
            let g = g as usize;
            // SAFETY: `o` addresses this task's own `l`, `GROUP` lanes per token for
            // n_tokens <= ARGMAX_MAX_TOKENS tokens; `isa` is supported; the groups
            // ascend, as the lanes' first-maximum rule needs.
            unsafe { run_isa(isa, &k, a, x, g, g + 1, &o) };
        }
        for (t, b) in best[..n_tokens].iter().enumerate() {
            if let Some((bv, brow)) = l.winner(t) {
                b.fetch_max(pack_best(bv, brow), Ordering::Relaxed);
            }
        }
    };
    if tasks > 1 {
        pool.parallel_for(tasks, &run_part);
    } else {
        run_part(0);
    }
    unpack_best(&scratch.best[..n_tokens], out);
}

/// A token's best (value, row) as one integer whose order is "larger value, then
/// lower row": `fetch_max` then combines tasks in any order. 0 means none.
fn pack_best(v: f32, row: usize) -> u64 {
    // -0.0 and 0.0 compare equal, so they must get one key (`+ 0.0` maps -0 to +0).
    let b = (v + 0.0).to_bits();
    let key = if b >> 31 == 1 { !b } else { b | 1 << 31 };
    (key as u64) << 32 | u64::from(!(row as u32))
}

/// Each token's row from its [`pack_best`] key (0, none: row 0).
fn unpack_best(best: &[AtomicU64], out: &mut [u32]) {
    for (o, b) in out.iter_mut().zip(best) {
        let p = b.load(Ordering::Relaxed);
        *o = if p == 0 { 0 } else { !(p as u32) };
    }
}

/// [`matmul_argmax`] on a given ISA (falls back to portable if this CPU lacks it).
pub fn matmul_argmax_with_isa(
    isa: Isa,
    w: &QMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [u32],
    scratch: &mut MatmulScratch,
    pool: &ThreadPool,
) {
    assert_eq!(
        x.len(),
        n_tokens * w.cols,
        "matmul_argmax: x must be n_tokens x cols"
    );
    assert_eq!(out.len(), n_tokens, "matmul_argmax: one index per token");
    assert!(
        n_tokens <= ARGMAX_MAX_TOKENS && w.rows <= u32::MAX as usize / 2,
        "matmul_argmax: at most {ARGMAX_MAX_TOKENS} tokens per call"
    );
    let Some((isa, tasks, pooled)) = prepare(isa, &[w], x, n_tokens, scratch, pool) else {
        return;
    };
    for b in &scratch.best[..n_tokens] {
        b.store(0, Ordering::Relaxed);
    }
    let (acts, best) = (&scratch.acts, &scratch.best);
    let run_part = |j: usize| {
        let k = Kernel::new(w, n_tokens);
        let n_groups = w.rows.div_ceil(GROUP);
        let (g0, g1) = task_groups(j, n_groups, tasks[0]);
        let mut l = LaneBest::new();
        // The kernels visit a task's groups in ascending order for every token, so a
        // strict `>` per lane keeps each lane's first (lowest-row) maximum.
        let o = l.output(w.rows);
        let a = &acts[ActFormat::for_weights(w.ty).index()];
        // SAFETY: `o` addresses this task's own `l`, `GROUP` lanes per token for
        // n_tokens <= ARGMAX_MAX_TOKENS tokens; `isa` is supported.
        unsafe { run_isa(isa, &k, a, x, g0, g1, &o) };
        for (t, b) in best[..n_tokens].iter().enumerate() {
            if let Some((bv, brow)) = l.winner(t) {
                b.fetch_max(pack_best(bv, brow), Ordering::Relaxed);
            }
        }
    };
    if pooled {
        pool.parallel_for(tasks[0], &run_part);
    } else {
        run_part(0);
    }
    unpack_best(&scratch.best[..n_tokens], out);
}
