//! Backends execute compiled block graphs. The CPU backend "compiles" a graph by planning
//! every buffer for its static shape; loading allocates them, so execution allocates
//! nothing. A QNN backend implements the same trait with real graph compilation.

use crate::attention::{attention, AttnDims, AttnScratch, BatchMask};
use crate::error::{Result, RuntimeError};
use crate::kernels::matmul::{
    matmul_argmax, matmul_epilogue, matmul_multi_epilogue, matmul_swiglu, Epilogue,
    ARGMAX_MAX_TOKENS,
};
use crate::kernels::screen::{screened_argmax, ScreenScratch, SCREEN_MAX_TOKENS};
use crate::kernels::{detected, matmul, MatmulScratch, ThreadPool};
use crate::kv_cache::KvCache;
use crate::model::Model;
use crate::ops::{rms_norm, RopeLayout, RopeTable};
use graphs::config::RopeStyle;
use graphs::ir::{BlockSpec, GraphShape};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Token id used for padding rows: never a real token, never accepted (pitfall 7).
pub const PAD_TOKEN: u32 = u32::MAX;

/// Which rows of the last block's output go through the LM head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsRows {
    /// Only the last valid row (written as row 0 of `logits`).
    Last,
    /// Every valid row.
    All,
}

/// Inputs and outputs of one graph execution.
pub struct BlockIo<'a> {
    /// Token ids, `shape.tokens` long (padding rows = [`PAD_TOKEN`]); read by a first block.
    pub tokens: &'a [u32],
    /// Hidden states `[shape.tokens][n_embd]`: written by a first block, read and updated
    /// by every later block.
    pub hidden: &'a mut [f32],
    pub kv: &'a mut KvCache,
    /// Valid rows, their tree/causal visibility and depths.
    pub mask: &'a BatchMask,
    /// Committed tokens; new rows go to KV slots `n_past + i`.
    pub n_past: usize,
    /// Last block only: where logits go (`[rows][vocab]`).
    pub logits: &'a mut [f32],
    pub logits_rows: LogitsRows,
}

/// Timing counters a profiler reads.
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphStats {
    pub compile: Duration,
    pub load: Duration,
    pub last_execute: Duration,
    pub total_execute: Duration,
    pub executions: u64,
}

/// A backend is shared by the compute thread and the graph loader of a progressive
/// prefill (`session::switching`), hence `Sync` and graphs that can move between them.
pub trait Backend: Sync {
    type Graph: Send;
    fn name(&self) -> &'static str;
    /// Build a graph for `block` at `shape` (not yet resident).
    fn compile(&self, block: &BlockSpec, shape: GraphShape) -> Result<Self::Graph>;
    /// Make the graph executable (allocate / upload its buffers).
    fn load(&self, graph: &mut Self::Graph) -> Result<()>;
    /// Release the graph's resident buffers (it can be loaded again).
    fn unload(&self, graph: &mut Self::Graph);
    fn is_loaded(&self, graph: &Self::Graph) -> bool;
    fn execute(&self, graph: &mut Self::Graph, io: BlockIo<'_>) -> Result<()>;
    fn stats(&self, graph: &Self::Graph) -> GraphStats;
    fn block<'g>(&self, graph: &'g Self::Graph) -> &'g BlockSpec;
    fn shape(&self, graph: &Self::Graph) -> GraphShape;
    /// Bytes the graph keeps resident while loaded (what a residency budget counts).
    fn resident_bytes(&self, graph: &Self::Graph) -> u64;

    /// [`Backend::execute`] for callers that need only each LM-head row's argmax
    /// (verification, greedy steps). Returns true when a last block wrote the argmax of
    /// row i of `io.logits_rows` to `argmax[i]` (ties to the lowest id) without writing
    /// logits; false when it wrote logits as `execute` does (the default), so the caller
    /// takes the argmax itself.
    fn execute_argmax(
        &self,
        graph: &mut Self::Graph,
        io: BlockIo<'_>,
        argmax: &mut [u32],
    ) -> Result<bool> {
        let _ = argmax;
        self.execute(graph, io).map(|_| false)
    }

    /// Whether a last block leaves its final hidden rows (before the output norm) in
    /// `io.hidden`, so the host can run the LM head over rows it chooses (the CPU does;
    /// a QNN graph ends in the LM head).
    fn leaves_final_hidden(&self) -> bool {
        false
    }
}

/// CPU backend: weights stay in the shared [`Model`]; graphs own activation buffers.
pub struct CpuBackend {
    model: Arc<Model>,
    rope: Arc<RopeTable>,
    kv_capacity: usize,
    /// The screened LM head's buffers (`kernels::screen`) if the model has a screen,
    /// shared by this backend's graphs: a few rows of vocabulary-sized floats.
    screen: Option<std::sync::Mutex<ScreenScratch>>,
}

impl CpuBackend {
    /// A backend for graphs with up to `kv_capacity` KV slots.
    pub fn new(model: Arc<Model>, kv_capacity: usize) -> Self {
        let c = model.config();
        let layout = match c.rope_style {
            RopeStyle::Normal => RopeLayout::Adjacent,
            RopeStyle::Neox => RopeLayout::Halves,
        };
        let rope = Arc::new(RopeTable::new(
            c.head_dim,
            c.rope_theta,
            kv_capacity,
            layout,
        ));
        let screen = model.weights().lm_screen.as_ref();
        let screen = screen.map(|s| std::sync::Mutex::new(ScreenScratch::new(s)));
        CpuBackend {
            model,
            rope,
            kv_capacity,
            screen,
        }
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }
}

/// The output write for a projection with an optional bias.
fn bias(b: &Option<Vec<f32>>) -> Epilogue<'_> {
    b.as_deref().map_or(Epilogue::Store, Epilogue::Bias)
}

/// RMS norm of every row of `x` into `out`; rows are split over the pool from 128 rows
/// on (a row takes ~0.05 us, a pool hand-off ~1 us: benchmarks/runs/kernels-worklog.md#item-81).
fn norm_rows(pool: &ThreadPool, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let e = weight.len();
    if x.len() < 128 * e {
        return rms_norm(x, weight, eps, out);
    }
    pool.for_each_chunk_mut(out, e, &|i, o| {
        rms_norm(&x[i * e..(i + 1) * e], weight, eps, o)
    });
}

/// Activation buffers of one graph.
struct Buffers {
    x_norm: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn_bits: Vec<AtomicU32>,
    attn: Vec<f32>,
    /// SwiGLU output (silu(gate) · up), written by one fused gate/up region.
    gate: Vec<f32>,
    up: Vec<f32>,
    mm: MatmulScratch,
    attn_scratch: AttnScratch,
}

pub struct CpuGraph {
    block: BlockSpec,
    shape: GraphShape,
    bufs: Option<Buffers>,
    stats: GraphStats,
}

impl Backend for CpuBackend {
    type Graph = CpuGraph;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn compile(&self, block: &BlockSpec, shape: GraphShape) -> Result<CpuGraph> {
        let t0 = Instant::now();
        let n_layer = self.model.config().n_layer;
        if block.layers.is_empty() || block.layers.end > n_layer {
            return Err(RuntimeError::Backend(format!(
                "block layers {:?} outside the model's {n_layer} layers",
                block.layers
            )));
        }
        if shape.tokens == 0 || shape.tokens > u16::MAX as usize {
            return Err(RuntimeError::Backend(format!(
                "bad token count {}",
                shape.tokens
            )));
        }
        if shape.kv_capacity > self.kv_capacity {
            return Err(RuntimeError::Backend(format!(
                "graph KV capacity {} exceeds the backend's {}",
                shape.kv_capacity, self.kv_capacity
            )));
        }
        let stats = GraphStats {
            compile: t0.elapsed(),
            ..GraphStats::default()
        };
        Ok(CpuGraph {
            block: block.clone(),
            shape,
            bufs: None,
            stats,
        })
    }

    fn load(&self, g: &mut CpuGraph) -> Result<()> {
        if g.bufs.is_some() {
            return Ok(());
        }
        let t0 = Instant::now();
        let c = self.model.config();
        let t = g.shape.tokens;
        let q_dim = c.n_head * c.head_dim;
        let kv_dim = c.n_head_kv * c.head_dim;
        let max_cols = c.n_embd.max(c.n_ff).max(q_dim);
        let threads = self.model.pool().n_threads();
        g.bufs = Some(Buffers {
            x_norm: vec![0.0; t * c.n_embd],
            q: vec![0.0; t * q_dim],
            k: vec![0.0; t * kv_dim],
            v: vec![0.0; t * kv_dim],
            attn_bits: (0..t * q_dim).map(|_| AtomicU32::new(0)).collect(),
            attn: vec![0.0; t * q_dim],
            gate: vec![0.0; t * c.n_ff],
            up: vec![0.0; t * c.n_ff],
            mm: MatmulScratch::new(t, max_cols),
            attn_scratch: AttnScratch::new(
                threads,
                g.shape.kv_capacity,
                c.head_dim,
                c.n_head / c.n_head_kv,
            ),
        });
        g.stats.load = t0.elapsed();
        Ok(())
    }

    fn unload(&self, g: &mut CpuGraph) {
        g.bufs = None;
    }

    fn is_loaded(&self, g: &CpuGraph) -> bool {
        g.bufs.is_some()
    }

    fn stats(&self, g: &CpuGraph) -> GraphStats {
        g.stats
    }

    fn block<'g>(&self, g: &'g CpuGraph) -> &'g BlockSpec {
        &g.block
    }

    /// Activation buffers of the graph (the weights are shared by every graph).
    fn resident_bytes(&self, graph: &CpuGraph) -> u64 {
        let c = self.model.config();
        let t = self.shape(graph).tokens as u64;
        let q = (c.n_head * c.head_dim) as u64;
        let kv = (c.n_head_kv * c.head_dim) as u64;
        let per_token = 2 * c.n_embd as u64 + 3 * q + 2 * kv + 2 * c.n_ff as u64;
        4 * t * per_token
    }

    fn shape(&self, g: &CpuGraph) -> GraphShape {
        g.shape
    }

    fn execute(&self, g: &mut CpuGraph, io: BlockIo<'_>) -> Result<()> {
        self.execute_with_head(g, io, None)
    }

    fn execute_argmax(
        &self,
        g: &mut CpuGraph,
        io: BlockIo<'_>,
        argmax: &mut [u32],
    ) -> Result<bool> {
        let last = g.block.last;
        self.execute_with_head(g, io, Some(argmax)).map(|_| last)
    }

    fn leaves_final_hidden(&self) -> bool {
        true
    }
}

impl CpuBackend {
    /// [`Backend::execute`]; with `argmax` given, a last block writes each LM-head
    /// row's argmax (`argmax[i]` for row i of `io.logits_rows`, ties to the lowest id)
    /// instead of its logits, and `io.logits` is left untouched: verification needs
    /// only the argmax, and skips writing `rows x vocab` floats.
    pub fn execute_with_head(
        &self,
        g: &mut CpuGraph,
        io: BlockIo<'_>,
        argmax: Option<&mut [u32]>,
    ) -> Result<()> {
        let t0 = Instant::now();
        let model = &*self.model;
        let c = model.config();
        let w = model.weights();
        let pool = model.pool();
        let t = g.shape.tokens;
        let e = c.n_embd;
        let n = io.mask.n_valid();
        let b = g
            .bufs
            .as_mut()
            .ok_or_else(|| RuntimeError::Backend("graph executed before load".into()))?;
        if n == 0 || n > t || io.tokens.len() < t || io.hidden.len() < t * e {
            return Err(RuntimeError::Backend(format!(
                "batch of {n} rows does not fit a graph of {t} tokens"
            )));
        }
        let held = io.mask.held();
        if io.n_past + held + n > g.shape.kv_capacity.min(io.kv.capacity()) {
            return Err(RuntimeError::Capacity(format!(
                "{} past + {held} held + {n} new tokens exceed the KV capacity {}",
                io.n_past,
                g.shape.kv_capacity.min(io.kv.capacity())
            )));
        }
        let hidden = &mut io.hidden[..t * e];
        if g.block.first {
            for (row, &tok) in hidden.chunks_exact_mut(e).zip(&io.tokens[..t]) {
                if (tok as usize) < c.vocab_size {
                    w.token_embd.dequantize_row(tok as usize, row);
                } else {
                    // Padding (or invalid) rows carry zeros; the mask keeps them inert.
                    row.fill(0.0);
                }
            }
        }
        let q_dim = c.n_head * c.head_dim;
        let kv_dim = c.n_head_kv * c.head_dim;
        let dims = AttnDims {
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
        };
        let run = |k: usize, f: &(dyn Fn(usize) + Sync)| pool.parallel_for(k, f);
        // Only the n valid rows are computed: rows are independent (every op is
        // row-wise and the mask never shows a padding row), so the padding rows of the
        // graph shape would be wasted work.
        let (xq, xkv, xe, xf) = (n * q_dim, n * kv_dim, n * e, n * c.n_ff);
        let hidden = &mut hidden[..xe];
        for layer in g.block.layers.clone() {
            let lw = &w.layers[layer];
            norm_rows(pool, hidden, &lw.attn_norm, c.rms_eps, &mut b.x_norm[..xe]);
            // q/k/v read the same normed rows: quantized once, one pool region, the
            // biases (qwen2) added by the output write.
            matmul_multi_epilogue(
                &[&lw.wq, &lw.wk, &lw.wv],
                &b.x_norm[..xe],
                n,
                &mut [&mut b.q[..xq], &mut b.k[..xkv], &mut b.v[..xkv]],
                &[bias(&lw.bq), bias(&lw.bk), bias(&lw.bv)],
                &mut b.mm,
                pool,
            );
            for i in 0..n {
                let pos = io.n_past + io.mask.depth(i);
                self.rope.apply(&mut b.q[i * q_dim..(i + 1) * q_dim], pos);
                self.rope.apply(&mut b.k[i * kv_dim..(i + 1) * kv_dim], pos);
                io.kv.write(
                    layer,
                    io.n_past + held + i,
                    &b.k[i * kv_dim..(i + 1) * kv_dim],
                    &b.v[i * kv_dim..(i + 1) * kv_dim],
                );
            }
            attention(
                &b.q,
                io.kv.layer_view(layer),
                io.n_past,
                io.mask,
                dims,
                &b.attn_scratch,
                &b.attn_bits,
                &run,
            );
            for (dst, src) in b.attn[..xq].iter_mut().zip(&b.attn_bits) {
                *dst = f32::from_bits(src.load(Ordering::Relaxed));
            }
            // Residual adds happen in the output write (hidden += x · Wᵀ).
            let acc = Epilogue::Accumulate;
            matmul_epilogue(&lw.wo, &b.attn[..xq], n, hidden, acc, &mut b.mm, pool);
            norm_rows(pool, hidden, &lw.ffn_norm, c.rms_eps, &mut b.x_norm[..xe]);
            // gate, up and silu(gate) · up in one region (no separate silu region).
            let (wg, wu, xn) = (&lw.w_gate, &lw.w_up, &b.x_norm[..xe]);
            let (gate, up) = (&mut b.gate[..xf], &mut b.up[..xf]);
            matmul_swiglu(wg, wu, xn, n, gate, up, &mut b.mm, pool);
            matmul_epilogue(&lw.w_down, &b.gate[..xf], n, hidden, acc, &mut b.mm, pool);
        }
        if g.block.last {
            let (first_row, rows) = match io.logits_rows {
                LogitsRows::Last => (n - 1, 1),
                LogitsRows::All => (0, n),
            };
            let v = c.vocab_size;
            if io.logits.len() < rows * v {
                return Err(RuntimeError::Backend("logits buffer too small".into()));
            }
            let xs = &mut b.x_norm[..rows * e];
            rms_norm(
                &hidden[first_row * e..(first_row + rows) * e],
                &w.output_norm,
                c.rms_eps,
                xs,
            );
            let lm = w.lm_head();
            // The LM head is split into row groups of the graph's token count so the
            // matmul scratch (sized for `t` tokens) always fits.
            if let Some(out) = argmax {
                if out.len() < rows {
                    return Err(RuntimeError::Backend("argmax buffer too small".into()));
                }
                let screened = match (&w.lm_screen, &self.screen) {
                    // A few rows: the screened head reads ~35% fewer bytes for the
                    // same argmax (from 8 rows on the head is compute-bound).
                    (Some(screen), Some(s)) if rows <= SCREEN_MAX_TOKENS => {
                        let mut s = s.lock().unwrap_or_else(|e| e.into_inner());
                        let s = &mut *s;
                        let oc = &mut out[..rows];
                        s.try_screen(rows) && {
                            screened_argmax(detected(), screen, lm, xs, rows, oc, s, pool);
                            true
                        }
                    }
                    _ => false,
                };
                if !screened {
                    let tc = t.min(ARGMAX_MAX_TOKENS);
                    for (xc, oc) in xs.chunks(tc * e).zip(out[..rows].chunks_mut(tc)) {
                        matmul_argmax(lm, xc, xc.len() / e, oc, &mut b.mm, pool);
                    }
                }
            } else {
                for (xc, oc) in xs
                    .chunks(t * e)
                    .zip(io.logits[..rows * v].chunks_mut(t * v))
                {
                    matmul(lm, xc, xc.len() / e, oc, &mut b.mm, pool);
                }
            }
        }
        g.stats.last_execute = t0.elapsed();
        g.stats.total_execute += g.stats.last_execute;
        g.stats.executions += 1;
        Ok(())
    }
}
