//! [`QnnBackend`]: the runtime's [`Backend`] on the QNN HTP. compile = lower + finalize +
//! serialize (or read the cached context binary); load = contextCreateFromBinary; unload =
//! contextFree; execute = host staging (fp16 conversion, mask, RoPE tables, past KV) and
//! graphExecute, then the new K/V rows go back into the host cache.

use crate::cache::{entry_key, file_hash, options_key, BinaryCache, CachedGraph};
use crate::error::QnnError;
use crate::graph::{Context, Graph, GraphOptions, IoTensor};
use crate::library::runtime;
use crate::lower::{build_block, MASK_HIDDEN};
use graphs::ir::{BlockSpec, GraphShape};
use half::f16;
use npu_runtime::backend::{Backend, BlockIo, GraphStats, LogitsRows};
use npu_runtime::error::{Result, RuntimeError};
use npu_runtime::kv_cache::KvCache;
use npu_runtime::model::Model;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// QNN-specific timings of one graph, beyond [`GraphStats`].
#[derive(Clone, Copy, Debug, Default)]
pub struct QnnTimes {
    /// Lowering (weights to fp16, graph construction).
    pub build: Duration,
    pub finalize: Duration,
    pub serialize: Duration,
    /// Reading a cached binary (when the compile was a cache hit).
    pub cache_read: Duration,
    pub cache_hit: bool,
    /// Last contextCreateFromBinary + graphRetrieve.
    pub load: Duration,
    /// Last contextFree.
    pub free: Duration,
    pub binary_bytes: usize,
}

pub struct QnnBackend {
    model: Arc<Model>,
    kv_capacity: usize,
    model_hash: u64,
    cache: Option<BinaryCache>,
    /// cos/sin per position, `[kv_capacity][head_dim / 2]`.
    cos: Vec<f32>,
    sin: Vec<f32>,
    graph_opts: GraphOptions,
}

struct Loaded {
    // Field order matters: the graph handle dies before its context.
    graph: Graph,
    _ctx: Context,
    in_bufs: Vec<Vec<u8>>,
    out_bufs: Vec<Vec<u8>>,
    row: Vec<f32>,
}

pub struct QnnGraph {
    block: BlockSpec,
    shape: GraphShape,
    name: String,
    binary: Arc<CachedGraph>,
    loaded: Option<Loaded>,
    stats: GraphStats,
    times: QnnTimes,
}

impl QnnGraph {
    pub fn times(&self) -> QnnTimes {
        self.times
    }

    pub fn inputs(&self) -> &[IoTensor] {
        &self.binary.inputs
    }

    pub fn outputs(&self) -> &[IoTensor] {
        &self.binary.outputs
    }
}

impl QnnBackend {
    /// A backend for graphs with up to `kv_capacity` KV slots. Fails with the fetch command
    /// when the HTP libraries are absent. `cache`: where context binaries are kept (None:
    /// always compile).
    pub fn new(model: Arc<Model>, kv_capacity: usize, cache: Option<BinaryCache>) -> Result<Self> {
        runtime()?;
        let c = model.config();
        if !c.head_dim.is_multiple_of(2)
            || c.n_head_kv == 0
            || !c.n_head.is_multiple_of(c.n_head_kv)
        {
            return Err(RuntimeError::Backend(format!(
                "unsupported head layout: {} heads, {} KV heads, head_dim {}",
                c.n_head, c.n_head_kv, c.head_dim
            )));
        }
        let model_hash = if cache.is_some() {
            file_hash(model.path())?
        } else {
            0
        };
        let half = c.head_dim / 2;
        let mut cos = Vec::with_capacity(kv_capacity * half);
        let mut sin = Vec::with_capacity(kv_capacity * half);
        // Same frequencies and f64 evaluation as the CPU RopeTable.
        for p in 0..kv_capacity {
            for i in 0..half {
                let inv = f64::from(c.rope_theta).powf(-2.0 * i as f64 / c.head_dim as f64);
                let a = p as f64 * inv;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Ok(QnnBackend {
            model,
            kv_capacity,
            model_hash,
            cache,
            cos,
            sin,
            graph_opts: GraphOptions::default(),
        })
    }

    /// HTP graph settings for every graph this backend compiles (part of the cache key).
    pub fn with_graph_options(mut self, opts: GraphOptions) -> Self {
        self.graph_opts = opts;
        self
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn times(&self, g: &QnnGraph) -> QnnTimes {
        g.times
    }

    fn build(
        &self,
        name: &str,
        block: &BlockSpec,
        shape: GraphShape,
        times: &mut QnnTimes,
    ) -> Result<CachedGraph> {
        let t0 = Instant::now();
        let ctx = Context::new()?;
        let mut b = ctx.build_with(name, self.graph_opts)?;
        build_block(&mut b, &self.model, block, shape, self.graph_opts.weights)?;
        times.build = t0.elapsed();
        let t1 = Instant::now();
        let graph = b.finalize()?;
        times.finalize = t1.elapsed();
        let t2 = Instant::now();
        let binary = ctx.binary()?;
        times.serialize = t2.elapsed();
        let (inputs, outputs) = (graph.inputs().to_vec(), graph.outputs().to_vec());
        drop(graph);
        drop(ctx);
        Ok(CachedGraph {
            binary,
            inputs,
            outputs,
        })
    }
}

fn to_f16(src: &[f32], dst: &mut [u8]) {
    for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
        o.copy_from_slice(&f16::from_f32(*x).to_le_bytes());
    }
}

fn from_f16(src: &[u8], dst: &mut [f32]) {
    for (c, o) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
    }
}

impl Backend for QnnBackend {
    type Graph = QnnGraph;

    fn name(&self) -> &'static str {
        "qnn-htp"
    }

    fn compile(&self, block: &BlockSpec, shape: GraphShape) -> Result<QnnGraph> {
        let t0 = Instant::now();
        let n_layer = self.model.config().n_layer;
        if block.layers.is_empty() || block.layers.end > n_layer {
            return Err(RuntimeError::Backend(format!(
                "block layers {:?} outside the model's {n_layer} layers",
                block.layers
            )));
        }
        if shape.tokens == 0 || shape.tokens > 4096 || shape.kv_capacity == 0 {
            return Err(RuntimeError::Backend(format!("bad graph shape {shape:?}")));
        }
        if shape.kv_capacity > self.kv_capacity {
            return Err(RuntimeError::Backend(format!(
                "graph KV capacity {} exceeds the backend's {}",
                shape.kv_capacity, self.kv_capacity
            )));
        }
        let name = format!(
            "b{}_{}_t{}_c{}",
            block.layers.start, block.layers.end, shape.tokens, shape.kv_capacity
        );
        let mut times = QnnTimes::default();
        let mut key = entry_key(self.model_hash, block, shape, runtime()?.build_id());
        key.push_str(&options_key(&self.graph_opts));
        let cached = self.cache.as_ref().and_then(|c| c.get(&key));
        let binary = match cached {
            Some(g) => {
                times.cache_hit = true;
                times.cache_read = t0.elapsed();
                g
            }
            None => {
                let g = self.build(&name, block, shape, &mut times)?;
                if let Some(c) = &self.cache {
                    // A failed cache write only costs a recompile next time.
                    if let Err(e) = c.put(&key, &g) {
                        tracing::warn!("{e}");
                    }
                }
                g
            }
        };
        times.binary_bytes = binary.binary.len();
        Ok(QnnGraph {
            block: block.clone(),
            shape,
            name,
            binary: Arc::new(binary),
            loaded: None,
            stats: GraphStats {
                compile: t0.elapsed(),
                ..GraphStats::default()
            },
            times,
        })
    }

    fn load(&self, g: &mut QnnGraph) -> Result<()> {
        if g.loaded.is_some() {
            return Ok(());
        }
        let t0 = Instant::now();
        let ctx = Context::from_binary(&g.binary.binary)?;
        let graph = ctx.graph(&g.name, g.binary.inputs.clone(), g.binary.outputs.clone())?;
        let in_bufs = g
            .binary
            .inputs
            .iter()
            .map(|t| vec![0u8; t.bytes()])
            .collect();
        let out_bufs = g
            .binary
            .outputs
            .iter()
            .map(|t| vec![0u8; t.bytes()])
            .collect();
        let c = self.model.config();
        g.loaded = Some(Loaded {
            graph,
            _ctx: ctx,
            in_bufs,
            out_bufs,
            row: vec![0.0; c.n_embd.max(c.n_head_kv * c.head_dim).max(c.vocab_size)],
        });
        g.times.load = t0.elapsed();
        g.stats.load = g.times.load;
        Ok(())
    }

    fn unload(&self, g: &mut QnnGraph) {
        let t0 = Instant::now();
        g.loaded = None;
        g.times.free = t0.elapsed();
    }

    fn is_loaded(&self, g: &QnnGraph) -> bool {
        g.loaded.is_some()
    }

    fn stats(&self, g: &QnnGraph) -> GraphStats {
        g.stats
    }

    fn block<'g>(&self, g: &'g QnnGraph) -> &'g BlockSpec {
        &g.block
    }

    fn shape(&self, g: &QnnGraph) -> GraphShape {
        g.shape
    }

    /// The context binary (fp16 weights and the finalized graph) plus the host staging
    /// buffers of its inputs and outputs.
    fn resident_bytes(&self, g: &QnnGraph) -> u64 {
        let io: usize = g
            .inputs()
            .iter()
            .chain(g.outputs())
            .map(|t| t.bytes())
            .sum();
        (g.times().binary_bytes + io) as u64
    }

    fn execute(&self, g: &mut QnnGraph, io: BlockIo<'_>) -> Result<()> {
        let t0 = Instant::now();
        let c = self.model.config();
        let (t, cap) = (g.shape.tokens, g.shape.kv_capacity);
        let e = c.n_embd;
        let half = c.head_dim / 2;
        let kv_dim = c.n_head_kv * c.head_dim;
        let n = io.mask.n_valid();
        if io.mask.held() > 0 {
            // The graph's inputs hold the committed past only; branch tails would need
            // their own slot map (multi-sequence decoding runs on the CPU backend).
            return Err(RuntimeError::Backend(
                "batches after held scratch rows (multi-sequence decoding) are not supported on QNN".into(),
            ));
        }
        let l = g
            .loaded
            .as_mut()
            .ok_or_else(|| RuntimeError::Backend("graph executed before load".into()))?;
        if n == 0 || n > t || io.tokens.len() < t || io.hidden.len() < t * e {
            return Err(RuntimeError::Backend(format!(
                "batch of {n} rows does not fit a graph of {t} tokens"
            )));
        }
        if io.n_past + n > cap.min(io.kv.capacity()) {
            return Err(RuntimeError::Capacity(format!(
                "{} past + {n} new tokens exceed the KV capacity {}",
                io.n_past,
                cap.min(io.kv.capacity())
            )));
        }
        let mut inp = l.in_bufs.iter_mut();
        let mut next = || {
            inp.next()
                .ok_or_else(|| QnnError::Invalid("graph has too few inputs".into()))
        };
        // Tokens or hidden states.
        let first = next()?;
        if g.block.first {
            for (o, &tok) in first.chunks_exact_mut(4).zip(&io.tokens[..t]) {
                // Padding / invalid ids read row 0; the mask keeps those rows inert.
                let id = if (tok as usize) < c.vocab_size {
                    tok as i32
                } else {
                    0
                };
                o.copy_from_slice(&id.to_le_bytes());
            }
        } else {
            to_f16(&io.hidden[..t * e], first);
        }
        // RoPE tables for each row's position.
        let (cos, sin) = (next()?, next()?);
        for i in 0..t {
            let pos = io.n_past + if i < n { io.mask.depth(i) } else { 0 };
            if pos >= self.kv_capacity {
                return Err(RuntimeError::Capacity(format!(
                    "position {pos} beyond the RoPE table"
                )));
            }
            let r = pos * half..(pos + 1) * half;
            to_f16(
                &self.cos[r.clone()],
                &mut cos[i * half * 2..(i + 1) * half * 2],
            );
            to_f16(&self.sin[r], &mut sin[i * half * 2..(i + 1) * half * 2]);
        }
        // Mask and slot map (`lower.rs`, slot attention): row i sees the committed slots
        // and, at slot `n_past + depth(j)`, each new row j on its ancestor chain (itself
        // included); every other slot is hidden and maps to its own (zero) past row.
        let mask = next()?;
        let hidden = f16::from_f32(MASK_HIDDEN).to_le_bytes();
        let zero = f16::from_f32(0.0).to_le_bytes();
        for i in 0..t {
            let row = &mut mask[i * cap * 2..(i + 1) * cap * 2];
            let seen = if i < n { io.n_past } else { 0 };
            for (j, m) in row.chunks_exact_mut(2).enumerate() {
                m.copy_from_slice(if j < seen { &zero } else { &hidden });
            }
            if i < n {
                for &j in io.mask.visible(i) {
                    let col = io.n_past + io.mask.depth(j as usize);
                    row[col * 2..col * 2 + 2].copy_from_slice(&zero);
                }
            }
        }
        let map = next()?;
        for i in 0..t {
            let row = &mut map[i * cap * 4..(i + 1) * cap * 4];
            for (s, m) in row.chunks_exact_mut(4).enumerate() {
                m.copy_from_slice(&(s as i32).to_le_bytes());
            }
            if i < n {
                for &j in io.mask.visible(i) {
                    let col = io.n_past + io.mask.depth(j as usize);
                    let src = (cap + j as usize) as i32;
                    row[col * 4..col * 4 + 4].copy_from_slice(&src.to_le_bytes());
                }
            }
        }
        // Past K/V of each layer: committed slots, zeros beyond. K (tiles) and V (per KV
        // head) come out of the cache as rows through `l.row`, a run of whole rows at a time.
        let (used, run) = (io.n_past * kv_dim * 2, l.row.len() / kv_dim);
        for layer in g.block.layers.clone() {
            for rows_into in [KvCache::k_rows_into, KvCache::v_rows_into] {
                let dst = next()?;
                let mut s0 = 0;
                while s0 < io.n_past {
                    let s1 = (s0 + run).min(io.n_past);
                    let rows = &mut l.row[..(s1 - s0) * kv_dim];
                    rows_into(&*io.kv, layer, s0, rows);
                    to_f16(rows, &mut dst[s0 * kv_dim * 2..s1 * kv_dim * 2]);
                    s0 = s1;
                }
                dst[used..cap * kv_dim * 2].fill(0);
            }
        }
        {
            // No per-call allocation: the staging buffers are passed as they are.
            l.graph.execute(&l.in_bufs, &mut l.out_bufs)?;
        }
        // New K/V rows into the host cache.
        let row = &mut l.row;
        for (li, layer) in g.block.layers.clone().enumerate() {
            let (ko, vo) = (&l.out_bufs[2 * li], &l.out_bufs[2 * li + 1]);
            for i in 0..n {
                let (k, v) = row.split_at_mut(kv_dim);
                from_f16(&ko[i * kv_dim * 2..(i + 1) * kv_dim * 2], &mut k[..kv_dim]);
                from_f16(&vo[i * kv_dim * 2..(i + 1) * kv_dim * 2], &mut v[..kv_dim]);
                io.kv
                    .write(layer, io.n_past + i, &k[..kv_dim], &v[..kv_dim]);
            }
        }
        let out = &l.out_bufs[2 * g.block.layers.len()];
        if g.block.last {
            let v = c.vocab_size;
            let (first_row, rows) = match io.logits_rows {
                LogitsRows::Last => (n - 1, 1),
                LogitsRows::All => (0, n),
            };
            if io.logits.len() < rows * v {
                return Err(RuntimeError::Backend("logits buffer too small".into()));
            }
            from_f16(
                &out[first_row * v * 2..(first_row + rows) * v * 2],
                &mut io.logits[..rows * v],
            );
        } else {
            from_f16(&out[..t * e * 2], &mut io.hidden[..t * e]);
        }
        g.stats.last_execute = t0.elapsed();
        g.stats.total_execute += g.stats.last_execute;
        g.stats.executions += 1;
        Ok(())
    }
}
