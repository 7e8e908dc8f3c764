//! Per-conversation sessions: chunked prefill, tree-shaped verification
//! batches, commit/rollback of the KV cache, greedy generation. [`Session`] is the one block
//! driver: generic over the [`Backend`] that runs its graphs (the CPU backend by default,
//! the QNN HTP backend on NPUs), it owns the KV cache, the batch masks and the buffers.

use crate::attention::BatchMask;
use crate::backend::{Backend, BlockIo, CpuBackend, LogitsRows, PAD_TOKEN};
use crate::error::{Result, RuntimeError};
use crate::kv_cache::KvCache;
pub use crate::kv_cache::KvPrecision;
pub use crate::model::{LoadOptions, Model};
use graphs::config::ModelConfig;
use graphs::ir::{cover_with_shapes, BlockSpec, GraphShape, DECODE_SHAPES};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod branches;
mod switching;
pub use branches::{decode_branches, BranchOutput};
use switching::{Forms, SwitchState};
pub use switching::{Residency, SwitchReport, Switching};

#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// KV slots (maximum context: committed tokens + one verification batch).
    pub kv_capacity: usize,
    /// Tokens per prefill-graph run (G1).
    pub prefill_chunk: usize,
    /// Largest decode/verify graph (G2 ladder up to this size, a power of two <= 64).
    pub max_verify: usize,
    /// Smallest decode/verify graph (a power of two <= `max_verify`): 1 on the CPU, whose
    /// graphs compute only their valid rows; 16 on QNN, where graphs of fewer rows compile
    /// to less precise HTP code and every graph costs its full size (docs/qnn.md).
    pub min_verify: usize,
    /// Number of layer blocks the model is cut into (each compiled separately).
    pub blocks: usize,
    /// How the KV cache stores K and V (`kv_cache::KvPrecision`: f32 by default, f16 for
    /// half the cache memory and attention bytes).
    pub kv_precision: KvPrecision,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            kv_capacity: 4096,
            prefill_chunk: graphs::ir::DEFAULT_PREFILL_TOKENS,
            max_verify: 64,
            min_verify: 1,
            blocks: 1,
            kv_precision: KvPrecision::F32,
        }
    }
}

/// Result of [`Session::prefill`].
pub struct PrefillOutput<'a> {
    /// Next-token logits after the last prompt token.
    pub logits: &'a [f32],
    /// Per prompt position (when asked): top-k `(token, logit)` successors, best first.
    pub topk: &'a [Vec<(u32, f32)>],
}

/// The graphs of one shape, block order, with the shape's token count.
pub type GraphSet<'a, B> = (usize, &'a mut [<B as Backend>::Graph]);

/// One graph per block for one shape.
struct ShapeGraphs<G> {
    tokens: usize,
    graphs: Vec<G>,
}

/// One conversation: KV cache plus every preplanned buffer, on backend `B`.
pub struct Session<B: Backend = CpuBackend> {
    model: Arc<Model>,
    backend: B,
    opts: SessionOptions,
    kv: KvCache,
    /// Prefill shape first (if distinct), then the decode ladder ascending.
    shapes: Vec<ShapeGraphs<B::Graph>>,
    mask: BatchMask,
    tokens: Vec<u32>,
    hidden: Vec<f32>,
    logits: Vec<f32>,
    topk: Vec<Vec<(u32, f32)>>,
    last_parents: Vec<i32>,
    last_batch: usize,
    /// Scratch rows after the committed ones that branch batches keep
    /// ([`Session::forward_branches`]); any other forward, commit or rollback drops them.
    held: usize,
    /// Which graph forms are resident ([`Session::enable_switching`]).
    forms: Forms,
    switching: Option<SwitchState>,
}

impl Session<CpuBackend> {
    /// A session on the CPU backend.
    pub fn new(model: Arc<Model>, opts: SessionOptions) -> Result<Self> {
        // Checked before the backend sizes its tables by the capacity.
        opts.check(model.config())?;
        let backend = CpuBackend::new(model.clone(), opts.kv_capacity);
        Session::with_backend(backend, model, opts)
    }
}

impl SessionOptions {
    /// Errors for options no session of a model with `c` can have.
    pub fn check(&self, c: &ModelConfig) -> Result<()> {
        let opts = self;
        if opts.kv_capacity == 0 || opts.kv_capacity > c.ctx_len {
            return Err(RuntimeError::Capacity(format!(
                "kv_capacity {} must be in 1..={} (the model's context length)",
                opts.kv_capacity, c.ctx_len
            )));
        }
        if opts.prefill_chunk == 0 || opts.prefill_chunk > 4096 {
            return Err(RuntimeError::InvalidInput(
                "prefill_chunk must be in 1..=4096".into(),
            ));
        }
        if !DECODE_SHAPES.contains(&opts.max_verify)
            || !DECODE_SHAPES.contains(&opts.min_verify)
            || opts.min_verify > opts.max_verify
        {
            return Err(RuntimeError::InvalidInput(format!(
                "min_verify <= max_verify must both be one of {DECODE_SHAPES:?}"
            )));
        }
        Ok(())
    }
}

impl<B: Backend> Session<B> {
    /// A session whose graphs run on `backend` (built for `model` with at least
    /// `opts.kv_capacity` KV slots). Compiles and loads every graph up front.
    pub fn with_backend(backend: B, model: Arc<Model>, opts: SessionOptions) -> Result<Self> {
        let c = model.config().clone();
        opts.check(&c)?;
        let blocks = BlockSpec::split(c.n_layer, opts.blocks);
        let mut sizes: Vec<usize> = DECODE_SHAPES
            .iter()
            .copied()
            .filter(|&s| s >= opts.min_verify && s <= opts.max_verify)
            .collect();
        if !sizes.contains(&opts.prefill_chunk) {
            sizes.push(opts.prefill_chunk);
        }
        let mut shapes = Vec::with_capacity(sizes.len());
        for &t in &sizes {
            let mut graphs = Vec::with_capacity(blocks.len());
            for b in &blocks {
                let mut g = backend.compile(b, GraphShape::new(t, opts.kv_capacity))?;
                backend.load(&mut g)?;
                graphs.push(g);
            }
            shapes.push(ShapeGraphs { tokens: t, graphs });
        }
        let max_t = opts.prefill_chunk.max(opts.max_verify);
        Ok(Session {
            kv: KvCache::with_precision(
                c.n_layer,
                c.n_head_kv,
                c.head_dim,
                opts.kv_capacity,
                opts.kv_precision,
            ),
            mask: BatchMask::new(max_t),
            tokens: vec![PAD_TOKEN; max_t],
            hidden: vec![0.0; max_t * c.n_embd],
            logits: vec![0.0; max_t * c.vocab_size],
            topk: Vec::new(),
            last_parents: Vec::with_capacity(opts.max_verify),
            last_batch: 0,
            held: 0,
            forms: Forms::All,
            switching: None,
            shapes,
            backend,
            opts,
            model,
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Every compiled graph, smallest shape first within the compile order (tests,
    /// profiles).
    pub fn graphs(&self) -> impl Iterator<Item = &B::Graph> {
        self.shapes.iter().flat_map(|s| &s.graphs)
    }

    /// The backend and the graphs of each shape (`(tokens, graphs)`), for profilers that
    /// load and unload forms themselves.
    pub fn graphs_mut(&mut self) -> (&B, Vec<GraphSet<'_, B>>) {
        let sets = self
            .shapes
            .iter_mut()
            .map(|s| (s.tokens, &mut s.graphs[..]))
            .collect();
        (&self.backend, sets)
    }

    /// Rows of the decode/verify graph a batch of `n` rows runs on (`None`: more than
    /// the largest).
    pub fn verify_graph_rows(&self, n: usize) -> Option<usize> {
        self.verify_shape_for(n)
    }

    /// The graph size a verify batch (or prefill remainder) of `n` rows runs on: the
    /// smallest decode/verify size that holds it.
    fn verify_shape_for(&self, n: usize) -> Option<usize> {
        DECODE_SHAPES
            .iter()
            .copied()
            .find(|&s| s >= n.max(self.opts.min_verify) && s <= self.opts.max_verify)
    }

    pub fn options(&self) -> &SessionOptions {
        &self.opts
    }

    /// Blocks of consecutive layers the model is cut into (graphs per shape).
    pub fn n_blocks(&self) -> usize {
        self.shapes.first().map_or(0, |s| s.graphs.len())
    }

    pub fn n_past(&self) -> usize {
        self.kv.n_past()
    }

    pub fn kv_capacity(&self) -> usize {
        self.kv.capacity()
    }

    /// Read access to the KV cache (tests, diagnostics).
    pub fn kv_cache(&self) -> &KvCache {
        &self.kv
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let v = self.model.vocab_size();
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= v) {
            return Err(RuntimeError::InvalidInput(format!(
                "token id {t} outside the vocabulary of {v}"
            )));
        }
        Ok(())
    }

    fn check_room(&self, n: usize) -> Result<()> {
        if n > self.kv.free() {
            return Err(RuntimeError::Capacity(format!(
                "{n} new tokens do not fit: {} of {} KV slots used (context too long)",
                self.kv.n_past(),
                self.kv.capacity()
            )));
        }
        Ok(())
    }

    /// Run every block of the graph set for `shape_tokens` on the first `n` staged tokens
    /// (the mask is already set).
    fn run(&mut self, shape_tokens: usize, rows: LogitsRows) -> Result<()> {
        self.run_with_head(shape_tokens, rows, None)
    }

    /// [`Session::run`]; with `argmax`, each LM-head row's argmax goes there: written by
    /// the backend's argmax head when it has one ([`Backend::execute_argmax`]), else taken
    /// from the logits.
    fn run_with_head(
        &mut self,
        shape_tokens: usize,
        rows: LogitsRows,
        mut argmax: Option<&mut [u32]>,
    ) -> Result<()> {
        let Session {
            backend,
            shapes,
            kv,
            mask,
            tokens,
            hidden,
            logits,
            model,
            ..
        } = self;
        let (e, v) = (model.config().n_embd, model.config().vocab_size);
        let set = shapes
            .iter_mut()
            .find(|s| s.tokens == shape_tokens)
            .ok_or_else(|| RuntimeError::Backend(format!("no graph of {shape_tokens} tokens")))?;
        let n_past = kv.n_past();
        let mut head_wrote_argmax = false;
        for g in set.graphs.iter_mut() {
            let io = BlockIo {
                tokens: &tokens[..shape_tokens],
                hidden: &mut hidden[..shape_tokens * e],
                kv,
                mask,
                n_past,
                logits,
                logits_rows: rows,
            };
            head_wrote_argmax = match argmax.as_deref_mut() {
                Some(out) => backend.execute_argmax(g, io, out)?,
                None => backend.execute(g, io).map(|_| false)?,
            };
        }
        if let (Some(out), false) = (argmax, head_wrote_argmax) {
            let n = match rows {
                LogitsRows::Last => 1,
                LogitsRows::All => mask.n_valid(),
            };
            for (o, row) in out[..n].iter_mut().zip(logits.chunks_exact(v)) {
                *o = self::argmax(row);
            }
        }
        Ok(())
    }

    /// The runs of a prefill of `n` tokens as (tokens, graph shape): full prefill chunks,
    /// then the remainder in one run on the smallest graph that holds it. The CPU backend
    /// computes only a run's valid rows, so a padded graph costs nothing extra, while
    /// covering a remainder of 99 with 64 + 32 + 2 + 1 rows streamed the weights four
    /// times. Rows are batch-invariant, so the logits and KV do not depend on the cut.
    fn prefill_runs(&self, n: usize) -> Vec<(usize, usize)> {
        let chunk = self.opts.prefill_chunk;
        let mut runs: Vec<(usize, usize)> = cover_with_shapes(n - n % chunk, chunk, 1)
            .into_iter()
            .map(|r| (r, r))
            .collect();
        let rem = n % chunk;
        if rem > 0 {
            let shape = self.verify_shape_for(rem).unwrap_or(chunk);
            runs.push((rem, shape));
        }
        runs
    }

    /// Checks a prefill's input and sizes the top-k rows; returns `topk` capped at the
    /// vocabulary.
    fn begin_prefill(&mut self, tokens: &[u32], topk: usize) -> Result<usize> {
        if tokens.is_empty() {
            return Err(RuntimeError::InvalidInput(
                "prefill of an empty prompt".into(),
            ));
        }
        self.check_tokens(tokens)?;
        self.held = 0;
        self.check_room(tokens.len())?;
        self.last_batch = 0;
        self.topk.truncate(tokens.len());
        self.topk.resize_with(tokens.len(), Vec::new);
        Ok(topk.min(self.model.vocab_size()))
    }

    /// Chunked causal prefill of `tokens` after the committed context. Returns the last
    /// position's logits and, if `topk > 0`, the top-k successors of every prompt position.
    pub fn prefill(&mut self, tokens: &[u32], topk: usize) -> Result<PrefillOutput<'_>> {
        let last_row = self.prefill_rows(tokens, topk)?;
        let v = self.model.vocab_size();
        Ok(PrefillOutput {
            logits: &self.logits[last_row * v..(last_row + 1) * v],
            topk: &self.topk,
        })
    }

    /// [`Session::prefill`]; returns the logits row of the last prompt position.
    fn prefill_rows(&mut self, tokens: &[u32], topk: usize) -> Result<usize> {
        if self.switching.is_some() {
            return self.prefill_switching(tokens, topk);
        }
        self.prefill_plain(tokens, topk)
    }

    /// A prefill on the resident graphs: full chunks on the prefill graph, the remainder
    /// on the smallest graph that holds it.
    fn prefill_plain(&mut self, tokens: &[u32], topk: usize) -> Result<usize> {
        let topk = self.begin_prefill(tokens, topk)?;
        if self.forms != Forms::All {
            self.set_forms(Forms::All)?;
        }
        let v = self.model.vocab_size();
        let runs = self.prefill_runs(tokens.len());
        let rows = if topk > 0 {
            LogitsRows::All
        } else {
            LogitsRows::Last
        };
        let mut off = 0;
        let mut last_row = 0;
        for (r, shape) in runs {
            self.tokens[..r].copy_from_slice(&tokens[off..off + r]);
            self.tokens[r..shape].fill(PAD_TOKEN);
            self.mask.set_causal(r)?;
            self.run(shape, rows)?;
            self.kv.advance(r)?;
            if topk > 0 {
                // One selection per row, rows spread over the pool (each is independent).
                let logits = &self.logits;
                let rows = &mut self.topk[off..off + r];
                self.model.pool().for_each_chunk_mut(rows, 8, &|c, out| {
                    for (j, o) in out.iter_mut().enumerate() {
                        let i = c * 8 + j;
                        top_k_into(&logits[i * v..(i + 1) * v], topk, o);
                    }
                });
                last_row = r - 1;
            }
            off += r;
        }
        if topk == 0 {
            self.topk.clear();
        }
        Ok(last_row)
    }

    /// One forward over new tokens arranged as a tree (`parents[i] = -1`: child of the last
    /// committed token; else the index `< i` of its parent). Node i sits at position
    /// `n_past + depth(i) - 1`; KV rows go to scratch slots `n_past + i` (`n_past` is
    /// unchanged). Returns `tokens.len() x vocab` logits.
    pub fn forward_tree(&mut self, tokens: &[u32], parents: &[i32]) -> Result<&[f32]> {
        self.forward_tree_inner(tokens, parents, None)?;
        let v = self.model.vocab_size();
        Ok(&self.logits[..tokens.len() * v])
    }

    /// [`Session::forward_tree`] for callers that need only each row's [`argmax`]
    /// (verification): `out` gets one token id per row, the same as `argmax` of that
    /// row's logits, but the `tokens.len() x vocab` logits are never written (the
    /// logits buffer keeps its previous contents). Allocates only if `out` is short.
    pub fn forward_tree_argmax(
        &mut self,
        tokens: &[u32],
        parents: &[i32],
        out: &mut Vec<u32>,
    ) -> Result<()> {
        out.clear();
        out.resize(tokens.len(), 0);
        self.forward_tree_inner(tokens, parents, Some(out))
    }

    fn forward_tree_inner(
        &mut self,
        tokens: &[u32],
        parents: &[i32],
        argmax: Option<&mut [u32]>,
    ) -> Result<()> {
        let n = tokens.len();
        if parents.len() != n {
            return Err(RuntimeError::InvalidInput(format!(
                "{n} tokens but {} parents",
                parents.len()
            )));
        }
        let shape = self.decode_batch_shape("tree", tokens)?;
        self.held = 0;
        self.check_room(n)?;
        self.ensure_decode_forms()?;
        self.last_batch = 0;
        self.mask.set_tree(parents)?;
        self.stage_tokens(tokens, shape);
        self.run_with_head(shape, LogitsRows::All, argmax)?;
        self.last_parents.clear();
        self.last_parents.extend_from_slice(parents);
        self.last_batch = n;
        Ok(())
    }

    /// The decode/verify graph shape for a batch of `tokens` (`what`: the batch's kind, for
    /// the error), after checking the ids.
    fn decode_batch_shape(&self, what: &str, tokens: &[u32]) -> Result<usize> {
        let n = tokens.len();
        let shape = self.verify_shape_for(n).filter(|_| n > 0).ok_or_else(|| {
            RuntimeError::InvalidInput(format!(
                "{what} batch of {n} tokens: must be 1..={}",
                self.opts.max_verify
            ))
        })?;
        self.check_tokens(tokens)?;
        Ok(shape)
    }

    /// Puts `tokens` in the input rows of a `shape`-row graph, padding the rest.
    fn stage_tokens(&mut self, tokens: &[u32], shape: usize) {
        self.tokens[..tokens.len()].copy_from_slice(tokens);
        self.tokens[tokens.len()..shape].fill(PAD_TOKEN);
    }

    /// Keep the KV rows of the last batch's nodes `path` (root-to-leaf) as positions
    /// `n_past..`, drop the rest.
    pub fn commit(&mut self, path: &[usize]) -> Result<()> {
        if self.last_batch == 0 {
            return Err(RuntimeError::InvalidInput(
                "commit without a preceding forward_tree batch".into(),
            ));
        }
        let mut expect = -1i32;
        for &p in path {
            if p >= self.last_batch || self.last_parents[p] != expect {
                return Err(RuntimeError::InvalidInput(format!(
                    "commit path {path:?} is not a root-to-leaf chain of the last batch"
                )));
            }
            expect = p as i32;
        }
        self.kv.compact(path, self.last_batch)?;
        self.last_batch = 0;
        Ok(())
    }

    /// Roll back to `n` committed tokens.
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        self.kv.truncate(n)?;
        self.last_batch = 0;
        self.held = 0;
        Ok(())
    }

    /// The K and V rows of the first `n` committed slots, layer by layer (`n` K rows then
    /// `n` V rows of `kv_dim` floats each): what [`Session::import_kv`] restores.
    pub fn export_kv(&self, n: usize) -> Result<Vec<f32>> {
        if n > self.kv.n_past() {
            return Err(RuntimeError::InvalidInput(format!(
                "export_kv: {n} slots asked, {} committed",
                self.kv.n_past()
            )));
        }
        let d = self.kv.kv_dim();
        if n == 0 || d == 0 {
            return Ok(Vec::new());
        }
        let mut out = vec![0.0; self.kv.n_layer() * 2 * n * d];
        for (layer, rows) in out.chunks_exact_mut(2 * n * d).enumerate() {
            let (k, v) = rows.split_at_mut(n * d);
            self.kv.k_rows_into(layer, 0, k);
            self.kv.v_rows_into(layer, 0, v);
        }
        Ok(out)
    }

    /// Replaces the session's state by `n` committed slots holding `rows` (from
    /// [`Session::export_kv`] of a session of the same model and engine): the KV cache is
    /// then bit for bit what prefilling those `n` tokens leaves, and the next prefill
    /// continues at position `n`.
    pub fn import_kv(&mut self, n: usize, rows: &[f32]) -> Result<()> {
        let d = self.kv.kv_dim();
        let layers = self.kv.n_layer();
        if rows.len() != layers * 2 * n * d || n > self.kv.capacity() {
            return Err(RuntimeError::InvalidInput(format!(
                "import_kv: {} floats for {n} slots of {layers} layers x {d} (capacity {})",
                rows.len(),
                self.kv.capacity()
            )));
        }
        self.truncate(0)?;
        for layer in 0..layers {
            let rows = &rows[layer * 2 * n * d..(layer + 1) * 2 * n * d];
            let (k, v) = rows.split_at(n * d);
            for slot in 0..n {
                let r = slot * d..(slot + 1) * d;
                self.kv.write(layer, slot, &k[r.clone()], &v[r]);
            }
        }
        self.kv.advance(n)
    }

    /// Feed one token and commit it; returns the next-token logits.
    pub fn decode_step(&mut self, token: u32) -> Result<&[f32]> {
        self.forward_tree_inner(&[token], &[-1], None)?;
        self.commit(&[0])?;
        let v = self.model.vocab_size();
        Ok(&self.logits[..v])
    }

    /// Feed one token and commit it; returns the next token's greedy id (`argmax` of
    /// the logits [`Session::decode_step`] returns) without writing the logits, so a
    /// screened LM head (`kernels::screen`) can skip most of its bytes.
    pub fn decode_step_argmax(&mut self, token: u32) -> Result<u32> {
        let mut id = [0u32];
        self.forward_tree_inner(&[token], &[-1], Some(&mut id))?;
        self.commit(&[0])?;
        Ok(id[0])
    }

    /// [`Session::prefill`] that reports top-k successors only for prompt positions
    /// `from..` (earlier rows are empty) and never materialises a chunk's full
    /// logits: every chunk runs with the last row's LM head only, then the kept
    /// final hidden rows of the range go through the LM head a few rows at a time
    /// into a small buffer that the top-k selection reads while it is in cache.
    /// The forward passes are the same as `prefill`'s (same chunks), and the matmul
    /// is batch-invariant, so the rows equal `prefill(tokens, topk)`'s bit for bit.
    pub fn prefill_topk_from(
        &mut self,
        tokens: &[u32],
        topk: usize,
        from: usize,
    ) -> Result<PrefillOutput<'_>> {
        /// LM-head rows per block: 16 x vocab f32 stays within a large L2/L3.
        const BLOCK: usize = 16;
        if !self.backend.leaves_final_hidden() || self.switching.is_some() {
            // The backend's graphs end in the LM head (or the switching prefill runs block
            // by block): every row's logits come from the last block.
            let last = self.prefill_rows(tokens, topk)?;
            let rows = self.topk.len();
            for r in &mut self.topk[..from.min(rows)] {
                r.clear();
            }
            let v = self.model.vocab_size();
            return Ok(PrefillOutput {
                logits: &self.logits[last * v..(last + 1) * v],
                topk: &self.topk,
            });
        }
        let topk = self.begin_prefill(tokens, topk)?;
        if self.forms != Forms::All {
            self.set_forms(Forms::All)?;
        }
        let c = self.model.config().clone();
        let (v, e) = (c.vocab_size, c.n_embd);
        for r in &mut self.topk {
            r.clear();
        }
        let want = topk > 0 && from < tokens.len();
        let mut block_logits = if want {
            vec![0.0f32; BLOCK * v]
        } else {
            Vec::new()
        };
        let mut xs = if want {
            vec![0.0f32; BLOCK * e]
        } else {
            Vec::new()
        };
        let mut mm = crate::kernels::MatmulScratch::new(if want { BLOCK } else { 1 }, e);
        let runs = self.prefill_runs(tokens.len());
        let mut off = 0;
        for (r, shape) in runs {
            self.tokens[..r].copy_from_slice(&tokens[off..off + r]);
            self.tokens[r..shape].fill(PAD_TOKEN);
            self.mask.set_causal(r)?;
            self.run(shape, LogitsRows::Last)?;
            self.kv.advance(r)?;
            if want {
                let first = from.max(off).min(off + r) - off;
                let w = self.model.weights();
                let mut i = first;
                while i < r {
                    let n = BLOCK.min(r - i);
                    crate::ops::rms_norm(
                        &self.hidden[i * e..(i + n) * e],
                        &w.output_norm,
                        c.rms_eps,
                        &mut xs[..n * e],
                    );
                    crate::kernels::matmul(
                        w.lm_head(),
                        &xs[..n * e],
                        n,
                        &mut block_logits[..n * v],
                        &mut mm,
                        self.model.pool(),
                    );
                    for j in 0..n {
                        top_k_into(
                            &block_logits[j * v..(j + 1) * v],
                            topk,
                            &mut self.topk[off + i + j],
                        );
                    }
                    i += n;
                }
            }
            off += r;
        }
        if !want {
            self.topk.clear();
        }
        // `run` with `LogitsRows::Last` wrote the last row's logits as row 0.
        Ok(PrefillOutput {
            logits: &self.logits[..v],
            topk: &self.topk,
        })
    }
}

/// Index of the largest logit; ties go to the lowest id (pitfall 2). NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &x) in logits.iter().enumerate() {
        if x > best_v {
            best = i;
            best_v = x;
        }
    }
    best as u32
}

/// Top-k `(id, logit)` of one row into `out`, best first, ties to the lower id.
pub fn top_k_into(logits: &[f32], k: usize, out: &mut Vec<(u32, f32)>) {
    out.clear();
    for (i, &x) in logits.iter().enumerate() {
        if x.is_nan() || (out.len() == k && x <= out[k - 1].1) {
            continue;
        }
        let pos = out.partition_point(|&(_, v)| v >= x);
        if out.len() == k {
            out.pop();
        }
        out.insert(pos, (i as u32, x));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    MaxTokens,
    EndOfGeneration,
    Callback,
    ContextFull,
}

#[derive(Clone, Debug)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub generated: usize,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    /// Decode steps (tokens fed back) per second; excludes the prefill-produced token.
    pub decode_tok_s: f64,
    /// Decode forward steps run after the prefill (one step advances every running branch).
    pub steps: usize,
    pub stop: StopReason,
}

impl GenerationStats {
    /// The stats of a generation whose prefill took `prefill` and whose `steps` decode
    /// forward steps took `decode`.
    pub fn new(
        prompt_tokens: usize,
        generated: usize,
        prefill: Duration,
        decode: Duration,
        steps: usize,
        stop: StopReason,
    ) -> Self {
        let decode_s = decode.as_secs_f64();
        GenerationStats {
            prompt_tokens,
            generated,
            prefill_ms: prefill.as_secs_f64() * 1e3,
            decode_ms: decode_s * 1e3,
            decode_tok_s: if decode_s > 0.0 {
                steps as f64 / decode_s
            } else {
                0.0
            },
            steps,
            stop,
        }
    }
}

/// Plain greedy decoding after prefilling `prompt` (appended to the session's context).
/// `on_token` receives every generated token (end-of-generation tokens are not emitted);
/// returning false stops.
pub fn generate_greedy<B: Backend>(
    session: &mut Session<B>,
    prompt: &[u32],
    max_tokens: usize,
    on_token: impl FnMut(u32) -> bool,
) -> Result<GenerationStats> {
    let t0 = Instant::now();
    let first = argmax(session.prefill(prompt, 0)?.logits);
    // The argmax-only head: no full logit rows are written.
    let step = |s: &mut Session<B>, tok: u32, _: usize| s.decode_step_argmax(tok);
    decode_loop(session, prompt.len(), t0, first, max_tokens, step, on_token)
}

/// [`generate_greedy`] choosing each token with `pick(logits, i)`, `i` the token's index
/// among the generated ones (0: the one after the prompt): plain sampled decoding.
pub fn generate_picked<B: Backend>(
    session: &mut Session<B>,
    prompt: &[u32],
    max_tokens: usize,
    mut pick: impl FnMut(&[f32], usize) -> u32,
    on_token: impl FnMut(u32) -> bool,
) -> Result<GenerationStats> {
    let t0 = Instant::now();
    let first = pick(session.prefill(prompt, 0)?.logits, 0);
    let step = |s: &mut Session<B>, tok: u32, i: usize| Ok(pick(s.decode_step(tok)?, i));
    decode_loop(session, prompt.len(), t0, first, max_tokens, step, on_token)
}

/// The decode loop after a prefill that began at `t0` and chose `tok`: `step(session,
/// tok, i)` feeds `tok` back and chooses generated token `i`.
fn decode_loop<B: Backend>(
    session: &mut Session<B>,
    prompt_tokens: usize,
    t0: Instant,
    mut tok: u32,
    max_tokens: usize,
    mut step: impl FnMut(&mut Session<B>, u32, usize) -> Result<u32>,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<GenerationStats> {
    let prefill = t0.elapsed();
    let t1 = Instant::now();
    let mut generated = 0;
    let mut steps = 0usize;
    let stop = loop {
        if generated == max_tokens {
            break StopReason::MaxTokens;
        }
        if session.model().is_eog(tok) {
            break StopReason::EndOfGeneration;
        }
        generated += 1;
        if !on_token(tok) {
            break StopReason::Callback;
        }
        if generated == max_tokens {
            break StopReason::MaxTokens;
        }
        if session.kv.free() == 0 {
            break StopReason::ContextFull;
        }
        tok = step(session, tok, generated)?;
        steps += 1;
    };
    Ok(GenerationStats::new(
        prompt_tokens,
        generated,
        prefill,
        t1.elapsed(),
        steps,
        stop,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_ties_go_to_lowest_id() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.5]), 1);
        assert_eq!(argmax(&[-1.0]), 0);
    }

    #[test]
    fn stats_keep_the_steps_and_their_rate() {
        let ms = Duration::from_millis;
        let s = GenerationStats::new(9, 12, ms(30), ms(2000), 10, StopReason::MaxTokens);
        assert_eq!((s.prompt_tokens, s.generated, s.steps), (9, 12, 10));
        assert_eq!(
            (s.prefill_ms, s.decode_ms, s.decode_tok_s),
            (30.0, 2000.0, 5.0)
        );
        // No decode time (a single token from the prefill): no rate rather than a division by zero.
        let s = GenerationStats::new(9, 1, ms(30), ms(0), 0, StopReason::EndOfGeneration);
        assert_eq!((s.steps, s.decode_tok_s), (0, 0.0));
    }

    #[test]
    fn top_k_is_sorted_and_stable() {
        let mut out = Vec::new();
        top_k_into(&[0.1, 5.0, 3.0, 5.0, f32::NAN, 4.0], 3, &mut out);
        assert_eq!(out, vec![(1, 5.0), (3, 5.0), (5, 4.0)]);
        top_k_into(&[2.0], 4, &mut out);
        assert_eq!(out, vec![(0, 2.0)]);
    }
}
