//! `out = x · Wᵀ`: one matrix, several matrices sharing an input, fused output epilogues
//! and SwiGLU, each bit-identical to the plain product and the separate element-wise steps.

use super::dispatch::{
    check_args, prepare, run_isa, task_groups, MatmulScratch, SendPtr, MAX_MULTI,
};
use super::kernel_io::{Kernel, OutOp, Output};
use super::qmatrix::QMatrix;
use crate::kernels::act::{ActFormat, QuantActs};
use crate::kernels::layout::GROUP;
use crate::kernels::pool::ThreadPool;
use crate::kernels::silu::silu_mul_unchecked;
use crate::kernels::simd::{detected, Isa};

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
        let (g0, g1) = task_groups(j, n_groups, tasks[m]);
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
        let (g0, g1) = task_groups(j, n_groups, n_tasks);
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
