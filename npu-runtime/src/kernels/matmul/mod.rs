//! Quantized weight matrices and `out = x · Wᵀ` with run-time ISA dispatch.

pub(super) mod kernel_io;
mod qmatrix;

pub use qmatrix::QMatrix;

use super::act::{quantize_parallel, ActFormat, QuantActs};
use super::ggml::GgmlType;
use super::layout::GROUP;
use super::pool::ThreadPool;
use super::portable;
use super::silu::silu_mul_unchecked;
use super::simd::{detected, Isa};
use kernel_io::{Kernel, OutOp, Output};
use std::sync::atomic::{AtomicU64, Ordering};

/// Buffers `matmul` needs (quantized activations), sized once for the
/// largest call so `matmul` never allocates.
///
/// One quantized copy per activation format, so [`matmul_multi`] can quantize a
/// shared input once per format its matrices need (untouched copies stay
/// unmapped zero pages).
pub struct MatmulScratch {
    max_tokens: usize,
    max_cols: usize,
    acts: [QuantActs; ActFormat::COUNT],
    /// Per token, the best (logit, row) found so far by [`matmul_argmax`] tasks.
    best: Vec<AtomicU64>,
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

fn check_args(w: &QMatrix, x: &[f32], n_tokens: usize, out: &[f32]) {
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

/// `out[n*rows + r] = Σ_k x[n*cols + k] · W[r][k]` for every token `n`, on the
/// ISA chosen by [`detected`].
///
/// Batch-invariant: token `n`'s outputs are bit-identical whatever `n_tokens`,
/// `n`'s position, the pool size and the ISA. Quantized formats quantize each
/// token's activations to int8 blocks of 32 (see `act`); F32/F16 use f32.
pub fn matmul(
    w: &QMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut MatmulScratch,
    pool: &ThreadPool,
) {
    matmul_with_isa(detected(), w, x, n_tokens, out, scratch, pool)
}

/// [`matmul`] on a given ISA (falls back to portable if this CPU lacks it).
pub fn matmul_with_isa(
    isa: Isa,
    w: &QMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut MatmulScratch,
    pool: &ThreadPool,
) {
    matmul_multi_with_isa(isa, &[w], x, n_tokens, &mut [out], scratch, pool)
}

/// Most matrices one [`matmul_multi`] call takes.
pub const MAX_MULTI: usize = 4;

/// What the output write does with each product `p = (x · Wᵀ)[t][r]`: fused here, the
/// element-wise step after a matmul costs no extra pass over the output, and each
/// element gets exactly the IEEE operations of the separate step (the same bits).
#[derive(Clone, Copy, Debug)]
pub enum Epilogue<'a> {
    /// `out = p`.
    Store,
    /// `out = p + bias[r]` (one bias per output feature, as `ops::add_bias`).
    Bias(&'a [f32]),
    /// `out = out + p` (a residual add, as `ops::add_in_place`).
    Accumulate,
}

/// `outs[i] = x · ws[i]ᵀ` for matrices that read the same input (q/k/v, gate/up):
/// the input is quantized once per activation format and all products run in one
/// pool region (one hand-off instead of one per matrix). Each output is
/// bit-identical to a separate [`matmul`] of its matrix.
pub fn matmul_multi(
    ws: &[&QMatrix],
    x: &[f32],
    n_tokens: usize,
    outs: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
    pool: &ThreadPool,
) {
    matmul_multi_with_isa(detected(), ws, x, n_tokens, outs, scratch, pool)
}

/// [`matmul_multi`] on a given ISA (falls back to portable if this CPU lacks it).
pub fn matmul_multi_with_isa(
    isa: Isa,
    ws: &[&QMatrix],
    x: &[f32],
    n_tokens: usize,
    outs: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
    pool: &ThreadPool,
) {
    let store = [Epilogue::Store; MAX_MULTI];
    let epis = &store[..ws.len().min(MAX_MULTI)];
    matmul_multi_epilogue_with_isa(isa, ws, x, n_tokens, outs, epis, scratch, pool)
}

/// [`matmul`] with an [`Epilogue`] applied to every output element.
pub fn matmul_epilogue(
    w: &QMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    epi: Epilogue,
    scratch: &mut MatmulScratch,
    pool: &ThreadPool,
) {
    let isa = detected();
    matmul_multi_epilogue_with_isa(isa, &[w], x, n_tokens, &mut [out], &[epi], scratch, pool)
}

/// [`matmul_multi`] with an [`Epilogue`] per matrix.
pub fn matmul_multi_epilogue(
    ws: &[&QMatrix],
    x: &[f32],
    n_tokens: usize,
    outs: &mut [&mut [f32]],
    epis: &[Epilogue],
    scratch: &mut MatmulScratch,
    pool: &ThreadPool,
) {
    let isa = detected();
    matmul_multi_epilogue_with_isa(isa, ws, x, n_tokens, outs, epis, scratch, pool)
}

/// [`matmul_multi_epilogue`] on a given ISA (falls back to portable if this CPU lacks it).
#[allow(clippy::too_many_arguments)]
pub fn matmul_multi_epilogue_with_isa(
    isa: Isa,
    ws: &[&QMatrix],
    x: &[f32],
    n_tokens: usize,
    outs: &mut [&mut [f32]],
    epis: &[Epilogue],
    scratch: &mut MatmulScratch,
    pool: &ThreadPool,
) {
    assert!(
        !ws.is_empty() && ws.len() <= MAX_MULTI && ws.len() == outs.len() && ws.len() == epis.len(),
        "matmul_multi: 1..={MAX_MULTI} matrices, one output and epilogue each"
    );
    for ((w, out), epi) in ws.iter().zip(outs.iter()).zip(epis) {
        check_args(w, x, n_tokens, out);
        if let Epilogue::Bias(b) = epi {
            assert_eq!(b.len(), w.rows, "matmul: one bias per output row");
        }
    }
    let Some((isa, tasks, pooled)) = prepare(isa, ws, x, n_tokens, scratch, pool) else {
        return;
    };
    let outs_ptr: [SendPtr; MAX_MULTI] = std::array::from_fn(|i| {
        SendPtr(
            outs.get_mut(i)
                .map_or(std::ptr::null_mut(), |o| o.as_mut_ptr()),
        )
    });
    let acts = &scratch.acts;
    // Runs task `j` of matrix `m`: an even share of its row groups.
    let run_part = |m: usize, j: usize| {
        let n_groups = ws[m].rows.div_ceil(GROUP);
        let (g0, g1) = (j * n_groups / tasks[m], (j + 1) * n_groups / tasks[m]);
        // SAFETY: outs_ptr[m] is outs[m] (checked n_tokens x rows, exclusively
        // borrowed for this call); task j of matrix m is the only writer of groups g0..g1.
        unsafe { run_groups(isa, ws[m], acts, x, n_tokens, g0, g1, outs_ptr[m], epis[m]) };
    };
    if !pooled {
        return (0..ws.len()).for_each(|m| run_part(m, 0));
    }
    let n_tasks: usize = tasks.iter().sum();
    pool.parallel_for(n_tasks, &|task| {
        let (mut m, mut j) = (0, task);
        while j >= tasks[m] {
            j -= tasks[m];
            m += 1;
        }
        run_part(m, j);
    });
}

/// SwiGLU in one pool region: `out = silu(x · w_gateᵀ) · (x · w_upᵀ)`, with `up`
/// (as large as `out`) left holding the up products. Each task computes a range of
/// row groups of both matrices, then `silu::silu_mul` over that range of every token
/// while it is still in cache: no separate silu region, and the bits of `matmul`
/// gate, `matmul` up, then `silu_mul`. (Not a silu per group in the output write:
/// 16 lanes at a time, a vector silu is latency-bound:
/// benchmarks/runs/kernels-worklog.md#session-7-epilogue.)
#[allow(clippy::too_many_arguments)]
pub fn matmul_swiglu(
    w_gate: &QMatrix,
    w_up: &QMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    up: &mut [f32],
    scratch: &mut MatmulScratch,
    pool: &ThreadPool,
) {
    matmul_swiglu_with_isa(
        detected(),
        w_gate,
        w_up,
        x,
        n_tokens,
        out,
        up,
        scratch,
        pool,
    )
}

/// [`matmul_swiglu`] on a given ISA (falls back to portable if this CPU lacks it).
#[allow(clippy::too_many_arguments)]
pub fn matmul_swiglu_with_isa(
    isa: Isa,
    w_gate: &QMatrix,
    w_up: &QMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    up: &mut [f32],
    scratch: &mut MatmulScratch,
    pool: &ThreadPool,
) {
    assert_eq!(
        (w_gate.rows, w_gate.cols),
        (w_up.rows, w_up.cols),
        "matmul_swiglu: gate and up must have one shape"
    );
    check_args(w_gate, x, n_tokens, out);
    check_args(w_up, x, n_tokens, up);
    let ws = [w_gate, w_up];
    let Some((isa, tasks, pooled)) = prepare(isa, &ws, x, n_tokens, scratch, pool) else {
        return;
    };
    let rows = w_gate.rows;
    let n_groups = rows.div_ceil(GROUP);
    // As many tasks as the two matrices would get apart, each over both.
    let n_tasks = if pooled {
        (tasks[0] + tasks[1]).min(n_groups)
    } else {
        1
    };
    let acts = &scratch.acts;
    let (out_ptr, up_ptr) = (SendPtr(out.as_mut_ptr()), SendPtr(up.as_mut_ptr()));
    let run_part = |j: usize| {
        let (g0, g1) = (j * n_groups / n_tasks, (j + 1) * n_groups / n_tasks);
        let (r0, r1) = (g0 * GROUP, (g1 * GROUP).min(rows));
        // SAFETY: `out` and `up` are n_tokens x rows (checked) and exclusively
        // borrowed; task j is the only one touching rows r0..r1 (groups g0..g1) of
        // either, so its slices below alias nothing another task uses; `isa` is
        // supported (from `prepare`).
        unsafe {
            run_groups(
                isa,
                w_gate,
                acts,
                x,
                n_tokens,
                g0,
                g1,
                out_ptr,
                Epilogue::Store,
            );
            run_groups(
                isa,
                w_up,
                acts,
                x,
                n_tokens,
                g0,
                g1,
                up_ptr,
                Epilogue::Store,
            );
            for t in 0..n_tokens {
                let at = t * rows + r0;
                let o = std::slice::from_raw_parts_mut(out_ptr.get().add(at), r1 - r0);
                let u = std::slice::from_raw_parts(up_ptr.get().add(at), r1 - r0);
                silu_mul_unchecked(isa, o, u);
            }
        }
    };
    if pooled {
        pool.parallel_for(n_tasks, &run_part);
    } else {
        run_part(0);
    }
}

/// Computes row groups `g0..g1` of `w` for every token and writes them into `out`
/// through `epi`.
///
/// # Safety
/// `isa` is supported; `out` points to `n_tokens * w.rows` floats that nobody else
/// reads or writes in rows of groups `g0..g1` during the call; `acts` holds `x`
/// quantized for `w`'s activation format.
#[allow(clippy::too_many_arguments)]
unsafe fn run_groups(
    isa: Isa,
    w: &QMatrix,
    acts: &[QuantActs; ActFormat::COUNT],
    x: &[f32],
    n_tokens: usize,
    g0: usize,
    g1: usize,
    out: SendPtr,
    epi: Epilogue,
) {
    let k = Kernel::new(w, n_tokens);
    let op = match epi {
        Epilogue::Store => OutOp::Store,
        Epilogue::Bias(b) => OutOp::Bias(b.as_ptr()),
        Epilogue::Accumulate => OutOp::Accumulate,
    };
    let o = Output {
        dst: out.get(),
        rows: w.rows,
        op,
    };
    let a = &acts[ActFormat::for_weights(w.ty).index()];
    // SAFETY: `o` addresses `out` (n_tokens x rows, ours in groups g0..g1) and, for a
    // bias, `rows` floats (checked by the caller); `isa` is supported.
    unsafe { run_isa(isa, &k, a, x, g0, g1, &o) };
}

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
        super::act::quantize(isa, fmt, x, &mut scratch.acts[fmt.index()]);
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
        let (g0, g1) = (j * n_groups / tasks[0], (j + 1) * n_groups / tasks[0]);
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

/// Checks the scratch, quantizes `x` once per activation format `ws` need and
/// splits the work into pool tasks: returns the ISA to run and the task count per
/// matrix and whether to use the pool (not for calls too small to pay for a
/// hand-off: one task per matrix, inline), or `None` for an empty batch.
fn prepare(
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

/// Runs the kernel of `isa` on groups `g0..g1`, writing through `out`.
///
/// # Safety
/// `isa` is supported; `out` is valid for the call's tokens and groups `g0..g1`
/// and nobody else uses those parts of it during the call (see [`Output::put`]).
unsafe fn run_isa(
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
            Isa::Avx512Vnni => super::x86_avx512::run(k, acts, x, g0, g1, out),
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => super::x86_avx2::run_vnni(k, acts, x, g0, g1, out),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => super::x86_avx2::run(k, acts, x, g0, g1, out),
            _ => portable::run(k, acts, x, g0, g1, out),
        }
    }
}

/// A raw output pointer shared by pool tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: only used to write disjoint output ranges from pool tasks (see `write`).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Scalar oracle: dequantize each row (ggml's reference arithmetic), dot in
/// f64 with the unquantized activations, round once.
pub fn matmul_reference(w: &QMatrix, x: &[f32], n_tokens: usize, out: &mut [f32]) {
    check_args(w, x, n_tokens, out);
    let mut row = vec![0f32; w.cols];
    for r in 0..w.rows {
        w.dequantize_row(r, &mut row);
        for n in 0..n_tokens {
            let xr = &x[n * w.cols..(n + 1) * w.cols];
            let s: f64 = row.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
            out[n * w.rows + r] = s as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::uniform;

    /// Random valid ggml bytes: random codes, small finite f16 scales.
    fn random_matrix(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> QMatrix {
        QMatrix::from_ggml(ty, rows, cols, &random_bytes(ty, rows, cols, seed)).unwrap()
    }

    /// The ggml bytes of [`random_matrix`].
    fn random_bytes(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
        let ts = ty.type_size();
        let n_blocks = rows * cols / ty.block_size();
        let noise = uniform(seed, n_blocks * ts);
        let mut bytes: Vec<u8> = noise.iter().map(|v| (v.to_bits() >> 7) as u8).collect();
        let at: &[usize] = match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K => &[0, 2],
            GgmlType::Q6K => &[208],
            _ => unreachable!("test types only"),
        };
        // Scales (and Q4_1/Q5_1 mins, of either sign) vary by block and row, so a kernel
        // that reads another row's or block's gets different bits.
        let signed_min = matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1);
        for b in bytes.chunks_exact_mut(ts) {
            for &p in at {
                let r = b[p];
                let mut v = 0.003 * (0.5 + r as f32 / 256.0);
                if signed_min && p == 2 && r & 1 == 1 {
                    v = -v;
                }
                b[p..p + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
        }
        bytes
    }

    /// `w · x` (a quantized `w`) by the canonical portable computation
    /// ([`portable::run_quant_canonical`]): the plain row-by-row statement of the
    /// arithmetic every kernel reproduces.
    fn matmul_canonical(w: &QMatrix, x: &[f32], n: usize, out: &mut [f32]) {
        let mut acts = QuantActs::new(n, w.cols);
        let fmt = ActFormat::for_weights(w.ty);
        super::super::act::quantize(Isa::Portable, fmt, x, &mut acts);
        let k = Kernel::new(w, n);
        let o = Output {
            dst: out.as_mut_ptr(),
            rows: w.rows,
            op: OutOp::Store,
        };
        // SAFETY: `out` holds n x rows floats, written only here; the activations were
        // quantized for these n tokens of w.cols columns.
        unsafe { portable::run_quant_canonical(&k, &acts, 0, w.rows.div_ceil(GROUP), &o) };
    }

    /// The portable kernel (its decode by words and its dot products reorganised for
    /// speed) gives the canonical bits: every format, widths of one and several
    /// super-blocks, partial last groups, 1-70 tokens (one and two token chunks).
    #[test]
    fn portable_kernel_equals_the_canonical_computation() {
        let mut seed = 0x5DEE_CE66_D1CEu64;
        let pool = ThreadPool::new(1);
        for ty in crate::kernels::ggml::QUANT_TYPES {
            for (rows, cols) in [(16, 256), (37, 512), (50, 768)] {
                let w = random_matrix(ty, rows, cols, &mut seed);
                for n in [1usize, 2, 3, 5, 8, 13, 64, 70] {
                    let x = uniform(&mut seed, n * cols);
                    let mut want = vec![f32::NAN; n * rows];
                    matmul_canonical(&w, &x, n, &mut want);
                    let mut got = vec![f32::NAN; n * rows];
                    let mut scratch = MatmulScratch::new(n, cols);
                    matmul_with_isa(Isa::Portable, &w, &x, n, &mut got, &mut scratch, &pool);
                    assert_eq!(bits(&got), bits(&want), "{ty:?} {rows}x{cols} n={n}");
                }
            }
        }
    }

    /// Every row read back from the repacked layout (one row decoded, as an embedding
    /// lookup does) equals ggml's reference dequantization of the original row, bit for
    /// bit, including rows of a partial last group.
    #[test]
    fn dequantize_row_equals_reference_for_every_format() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let (rows, cols) = (37, 512);
        for ty in crate::kernels::ggml::QUANT_TYPES {
            let raw = random_bytes(ty, rows, cols, &mut seed);
            let w = QMatrix::from_ggml(ty, rows, cols, &raw).unwrap();
            let rb = raw.len() / rows;
            let (mut got, mut want) = (vec![0f32; cols], vec![0f32; cols]);
            for r in 0..rows {
                w.dequantize_row(r, &mut got);
                graphs::quant::dequantize_row(ty, &raw[r * rb..(r + 1) * rb], &mut want).unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{ty:?} row {r}");
            }
        }
    }

    /// `|out - exact| <= Σ_blocks amax_b/254 · Σ|w_b| + 1e-5 Σ|w·x|` (activation
    /// quantization moves each x by at most half a step): an oracle independent of
    /// the kernels and of which quantized copy they read.
    fn assert_within_quantization_bound(w: &QMatrix, x: &[f32], n: usize, out: &[f32]) {
        let mut row = vec![0f32; w.cols()];
        for r in 0..w.rows() {
            w.dequantize_row(r, &mut row);
            for t in 0..n {
                let xt = &x[t * w.cols()..][..w.cols()];
                let prods = row.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64);
                let exact: f64 = prods.clone().sum();
                let mag: f64 = prods.map(f64::abs).sum();
                let quant: f64 = row
                    .chunks(32)
                    .zip(xt.chunks(32))
                    .map(|(wb, xb)| {
                        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                        amax / 254.0 * wb.iter().map(|v| v.abs() as f64).sum::<f64>()
                    })
                    .sum();
                let err = (out[t * w.rows() + r] as f64 - exact).abs();
                assert!(
                    err <= quant * 1.0001 + 1e-5 * mag + 1e-6,
                    "row {r} token {t}: {err}"
                );
            }
        }
    }

    /// One region over several matrices (mixed activation formats, tiny and big
    /// calls, 1-3 threads) gives every output the bits of its own `matmul`.
    #[test]
    fn multi_equals_separate_calls_bitwise() {
        let mut seed = 11;
        let cols = 512;
        let ws = [
            random_matrix(GgmlType::Q5_0, 200, cols, &mut seed),
            random_matrix(GgmlType::Q6K, 40, cols, &mut seed),
            random_matrix(GgmlType::Q4_1, 33, cols, &mut seed),
            random_matrix(GgmlType::Q4K, 16, cols, &mut seed),
        ];
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            for n in [1usize, 3, 8] {
                let x = uniform(&mut seed, n * cols);
                for isa in Isa::available() {
                    let mut scratch = MatmulScratch::new(n, cols);
                    for k in 1..=ws.len() {
                        let refs: Vec<&QMatrix> = ws[..k].iter().collect();
                        let mut want: Vec<Vec<f32>> =
                            refs.iter().map(|w| vec![0.0; n * w.rows()]).collect();
                        for (w, o) in refs.iter().zip(&mut want) {
                            matmul_with_isa(isa, w, &x, n, o, &mut scratch, &pool);
                        }
                        let mut got: Vec<Vec<f32>> =
                            refs.iter().map(|w| vec![f32::NAN; n * w.rows()]).collect();
                        let mut outs: Vec<&mut [f32]> =
                            got.iter_mut().map(|o| o.as_mut_slice()).collect();
                        matmul_multi_with_isa(isa, &refs, &x, n, &mut outs, &mut scratch, &pool);
                        for ((g, w), m) in got.iter().zip(&want).zip(&refs) {
                            let bits =
                                |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                            assert_eq!(bits(g), bits(w), "{isa:?} n={n} k={k} t={threads}");
                            assert_within_quantization_bound(m, &x, n, g);
                        }
                    }
                }
            }
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    /// Every epilogue, alone and mixed in one `matmul_multi` region, gives the bits of
    /// the plain `matmul` followed by the separate element-wise op (`ops::add_bias`,
    /// `ops::add_in_place`): every format, a partial last group,
    /// 1-3 threads, tiny (inline) and pooled calls, every ISA.
    #[test]
    fn epilogues_equal_the_unfused_sequence() {
        use crate::ops::{add_bias, add_in_place};
        let mut seed = 41;
        let (rows, cols) = (200 + 5, 256);
        for ty in crate::kernels::ggml::QUANT_TYPES {
            let w = random_matrix(ty, rows, cols, &mut seed);
            let bias: Vec<f32> = uniform(&mut seed, rows);
            for threads in [1, 2, 3] {
                let pool = ThreadPool::new(threads);
                for n in [1usize, 5, 16] {
                    let mut scratch = MatmulScratch::new(n, cols);
                    let x = uniform(&mut seed, n * cols);
                    let init: Vec<f32> = uniform(&mut seed, n * rows)
                        .iter()
                        .map(|v| v * 12.0)
                        .collect();
                    for isa in Isa::available() {
                        let mut p = vec![0f32; n * rows];
                        matmul_with_isa(isa, &w, &x, n, &mut p, &mut scratch, &pool);
                        let mut with_bias = p.clone();
                        add_bias(&mut with_bias, &bias);
                        let mut accumulated = init.clone();
                        add_in_place(&mut accumulated, &p);
                        let cases = [
                            (Epilogue::Store, &p),
                            (Epilogue::Bias(&bias), &with_bias),
                            (Epilogue::Accumulate, &accumulated),
                        ];
                        let what = format!("{ty:?} {isa:?} n={n} t={threads}");
                        for (epi, want) in cases {
                            let mut got = init.clone();
                            matmul_multi_epilogue_with_isa(
                                isa,
                                &[&w],
                                &x,
                                n,
                                &mut [&mut got],
                                &[epi],
                                &mut scratch,
                                &pool,
                            );
                            assert_eq!(bits(&got), bits(want), "{epi:?} {what}");
                        }
                        // All of them in one region (one matrix, one output each).
                        let mut got: Vec<Vec<f32>> = (0..3).map(|_| init.clone()).collect();
                        let mut outs: Vec<&mut [f32]> =
                            got.iter_mut().map(|o| o.as_mut_slice()).collect();
                        let epis = cases.map(|c| c.0);
                        let ws = [&w; 3];
                        matmul_multi_epilogue_with_isa(
                            isa,
                            &ws,
                            &x,
                            n,
                            &mut outs,
                            &epis,
                            &mut scratch,
                            &pool,
                        );
                        for (g, (epi, want)) in got.iter().zip(cases) {
                            assert_eq!(bits(g), bits(want), "multi {epi:?} {what}");
                        }
                    }
                }
            }
        }
    }

    /// `matmul_swiglu` equals gate and up products followed by `silu_mul`, bit for
    /// bit: mixed formats (two activation formats), a partial last group, more tasks
    /// than threads, every batch size up to 17, every ISA.
    #[test]
    fn swiglu_equals_gate_up_then_silu_mul() {
        use crate::kernels::silu::silu_mul_with_isa;
        let mut seed = 43;
        let (rows, cols) = (16 * 21 + 3, 512);
        let pairs = [
            (GgmlType::Q4K, GgmlType::Q6K),
            (GgmlType::Q5_0, GgmlType::Q8_0),
            (GgmlType::Q4_1, GgmlType::Q4_1),
        ];
        for (tg, tu) in pairs {
            let wg = random_matrix(tg, rows, cols, &mut seed);
            let wu = random_matrix(tu, rows, cols, &mut seed);
            for threads in [1, 2, 3] {
                let pool = ThreadPool::new(threads);
                let mut scratch = MatmulScratch::new(17, cols);
                for n in 1..=17 {
                    // Large inputs so the gate products reach silu's both tails.
                    let x: Vec<f32> = uniform(&mut seed, n * cols)
                        .iter()
                        .map(|v| v * 40.0)
                        .collect();
                    for isa in Isa::available() {
                        let mut want = vec![0f32; n * rows];
                        let mut up = vec![0f32; n * rows];
                        matmul_with_isa(isa, &wg, &x, n, &mut want, &mut scratch, &pool);
                        matmul_with_isa(isa, &wu, &x, n, &mut up, &mut scratch, &pool);
                        silu_mul_with_isa(Isa::Portable, &mut want, &up);
                        let mut got = vec![f32::NAN; n * rows];
                        let mut got_up = vec![f32::NAN; n * rows];
                        let (g, u) = (&mut got, &mut got_up);
                        matmul_swiglu_with_isa(isa, &wg, &wu, &x, n, g, u, &mut scratch, &pool);
                        assert_eq!(bits(&got_up), bits(&up), "up products");
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "{tg:?}/{tu:?} {isa:?} n={n} t={threads}"
                        );
                    }
                }
            }
        }
    }

    /// Random ggml bytes for `rows` rows in which every row is a copy of one random
    /// row, except `big` rows, copies of that row with a doubled scale: every output
    /// of a token ties with all others of its kind, so argmax tie-breaking is tested.
    fn tied_matrix(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        big: &[usize],
        seed: &mut u64,
    ) -> QMatrix {
        let row_bytes = ty.row_bytes(cols).unwrap();
        assert_eq!(ty, GgmlType::Q8_0, "tied_matrix builds Q8_0 rows");
        let mut base = vec![0u8; row_bytes];
        let mut s = *seed;
        for b in base.chunks_exact_mut(34) {
            b[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            for c in &mut b[2..] {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *c = (s >> 33) as u8;
            }
        }
        *seed = s;
        let mut doubled = base.clone();
        for b in doubled.chunks_exact_mut(34) {
            b[..2].copy_from_slice(&half::f16::from_f32(0.02).to_le_bytes());
        }
        let mut bytes = Vec::with_capacity(rows * row_bytes);
        for r in 0..rows {
            bytes.extend_from_slice(if big.contains(&r) { &doubled } else { &base });
        }
        QMatrix::from_ggml(ty, rows, cols, &bytes).unwrap()
    }

    /// `matmul_argmax` returns `session::argmax` of every row of the full `matmul`
    /// output: random matrices of every format (many groups, so several tasks and a
    /// partial last group), exact ties across groups and tasks, all-negative rows
    /// (the padding lanes of a partial group must not win), 1-3 threads, every ISA.
    #[test]
    fn argmax_equals_argmax_of_full_output() {
        use crate::session::argmax;
        let mut seed = 31;
        let cols = 256;
        let mut cases: Vec<(QMatrix, &str)> = crate::kernels::ggml::QUANT_TYPES
            .iter()
            .map(|&ty| (random_matrix(ty, 1000 + 7, cols, &mut seed), "random"))
            .collect();
        cases.push((
            tied_matrix(GgmlType::Q8_0, 421, cols, &[37, 300, 301, 415], &mut seed),
            "ties",
        ));
        cases.push((
            tied_matrix(GgmlType::Q8_0, 37, cols, &[], &mut seed),
            "all equal",
        ));
        let mut checked_ties = [0usize; 2];
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            for n in [1usize, 5, 8, 16, ARGMAX_MAX_TOKENS] {
                let mut scratch = MatmulScratch::new(n, cols);
                let mut x = uniform(&mut seed, n * cols);
                // Half the tokens negated: the tied rows' products flip sign.
                for t in (0..n).step_by(2) {
                    x[t * cols..(t + 1) * cols]
                        .iter_mut()
                        .for_each(|v| *v = -*v);
                }
                for (w, what) in &cases {
                    for isa in Isa::available() {
                        let mut full = vec![0f32; n * w.rows()];
                        matmul_with_isa(isa, w, &x, n, &mut full, &mut scratch, &pool);
                        let want: Vec<u32> = full.chunks_exact(w.rows()).map(argmax).collect();
                        let mut got = vec![u32::MAX; n];
                        matmul_argmax_with_isa(isa, w, &x, n, &mut got, &mut scratch, &pool);
                        assert_eq!(
                            got,
                            want,
                            "{what} {:?} {isa:?} n={n} t={threads}",
                            w.ggml_type()
                        );
                        if *what == "ties" {
                            for (t, &a) in want.iter().enumerate() {
                                let row = &full[t * w.rows()..][..w.rows()];
                                assert!(row.iter().filter(|&&v| v == row[a as usize]).count() > 1);
                                checked_ties[usize::from(a == 37)] += 1;
                            }
                        }
                    }
                }
            }
        }
        // Both tie kinds occurred: the first doubled row (37) and row 0 of the others.
        assert!(
            checked_ties[0] > 0 && checked_ties[1] > 0,
            "{checked_ties:?}"
        );
    }

    /// Every batch size from 1 to 33 (so any split of the batch into token tiles
    /// leaves a ragged tail somewhere) and 64, 65, 129, 130 (one and two token
    /// chunks and a tail), every format, every ISA, row counts that leave a partial
    /// group (37 rows: alone after two full ones; 245 rows: 16 groups, two per pool
    /// task, so the last group is the partial second of a pair for kernels that run
    /// groups in pairs): each token gets the bits of that token computed alone on
    /// the portable kernel.
    #[test]
    fn every_batch_size_is_bit_identical_to_portable_single_tokens() {
        let mut seed = 23;
        let (cols, max_n) = (512, 130);
        let ns: Vec<usize> = (1..=33).chain([64, 65, 129, 130]).collect();
        let pool = ThreadPool::new(2);
        let mut scratch = MatmulScratch::new(max_n, cols);
        let types = crate::kernels::ggml::QUANT_TYPES;
        for (ty, rows) in types.iter().flat_map(|&ty| [(ty, 37), (ty, 245)]) {
            let w = random_matrix(ty, rows, cols, &mut seed);
            let x = uniform(&mut seed, max_n * cols);
            let mut alone = vec![0f32; max_n * rows];
            for t in 0..max_n {
                let (xt, ot) = (&x[t * cols..][..cols], &mut alone[t * rows..][..rows]);
                matmul_with_isa(Isa::Portable, &w, xt, 1, ot, &mut scratch, &pool);
            }
            assert_within_quantization_bound(&w, &x, max_n, &alone);
            for isa in Isa::available() {
                for &n in &ns {
                    let mut out = vec![f32::NAN; n * rows];
                    matmul_with_isa(isa, &w, &x[..n * cols], n, &mut out, &mut scratch, &pool);
                    for (i, (g, a)) in out.iter().zip(&alone).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            a.to_bits(),
                            "{ty:?} {isa:?} n={n} token {} row {}",
                            i / rows,
                            i % rows
                        );
                    }
                }
            }
        }
    }
}
