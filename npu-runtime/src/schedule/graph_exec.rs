//! [`ScheduleExecutor`] over any runtime [`Backend`]: each block has a G1 graph (prefill
//! chunk shape) and a G2 graph (verify shape), compiled up front; loading and unloading a
//! form is the backend's own `load`/`unload` (CPU: buffers; QNN: a context binary loaded
//! into and freed from the HTP). Warm-up measures what a switch costs on each.

use super::exec::ScheduleExecutor;
use super::plan::Form;
use super::{Result, ScheduleError};
use crate::attention::BatchMask;
use crate::backend::{Backend, BlockIo, LogitsRows, PAD_TOKEN};
use crate::kv_cache::KvCache;
use crate::session::{argmax, Model};
use graphs::ir::{BlockSpec, GraphShape};
use std::sync::{Arc, Mutex, MutexGuard};

fn rt(e: crate::error::RuntimeError) -> ScheduleError {
    ScheduleError::Executor(e.to_string())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Per-prompt state touched only by compute (the loader never locks it).
struct ComputeState {
    kv: KvCache,
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    hidden: Vec<f32>,
    mask_g1: BatchMask,
    mask_g2: BatchMask,
    logits: Vec<f32>,
    /// Logits of the first decode step.
    decode_logits: Vec<f32>,
}

/// Any backend drives the executor (kept as a name for callers written against it).
pub trait FormBackend: Backend {}
impl<B: Backend> FormBackend for B {}

pub struct GraphExecutor<B: FormBackend>
where
    B::Graph: Send,
{
    model: Arc<Model>,
    backend: B,
    chunk: usize,
    g2: usize,
    /// `[G1, G2]` graphs of each block.
    graphs: Vec<Mutex<[B::Graph; 2]>>,
    state: Mutex<ComputeState>,
}

impl<B: FormBackend> GraphExecutor<B>
where
    B::Graph: Send,
{
    /// Compiles both forms of `n_blocks` blocks on `backend` (whose KV capacity must be at
    /// least `kv_capacity`); G1 forms start resident, G2 not.
    pub fn with_backend(
        backend: B,
        model: Arc<Model>,
        n_blocks: usize,
        chunk: usize,
        g2: usize,
        kv_capacity: usize,
    ) -> Result<Self> {
        if g2 == 0 || chunk == 0 || !chunk.is_multiple_of(g2) {
            return Err(ScheduleError::Profile(format!(
                "chunk {chunk} must be a positive multiple of the G2 size {g2}"
            )));
        }
        let c = model.config().clone();
        let mut graphs = Vec::with_capacity(n_blocks);
        for spec in BlockSpec::split(c.n_layer, n_blocks) {
            let mut g1 = backend
                .compile(&spec, GraphShape::new(chunk, kv_capacity))
                .map_err(rt)?;
            let g2g = backend
                .compile(&spec, GraphShape::new(g2, kv_capacity))
                .map_err(rt)?;
            backend.load(&mut g1).map_err(rt)?;
            graphs.push(Mutex::new([g1, g2g]));
        }
        let state = ComputeState {
            kv: KvCache::new(c.n_layer, c.n_head_kv, c.head_dim, kv_capacity),
            prompt: Vec::new(),
            tokens: vec![PAD_TOKEN; chunk],
            hidden: vec![0.0; chunk * c.n_embd],
            mask_g1: BatchMask::new(chunk),
            mask_g2: BatchMask::new(g2),
            logits: vec![0.0; c.vocab_size],
            decode_logits: vec![0.0; c.vocab_size],
        };
        Ok(GraphExecutor {
            model,
            backend,
            chunk,
            g2,
            graphs,
            state: Mutex::new(state),
        })
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn n_blocks(&self) -> usize {
        self.graphs.len()
    }

    /// Layer range of each block, e.g. "0-7".
    pub fn layer_labels(&self) -> Vec<String> {
        self.graphs
            .iter()
            .map(|g| {
                let g = lock(g);
                let l = &self.backend.block(&g[0]).layers;
                format!("{}-{}", l.start, l.end - 1)
            })
            .collect()
    }

    /// Sets the prompt the next prefill processes.
    pub fn set_prompt(&self, prompt: &[u32]) -> Result<()> {
        let v = self.model.vocab_size();
        if prompt.is_empty() || prompt.iter().any(|&t| t as usize >= v) {
            return Err(ScheduleError::Executor(
                "prompt empty or has ids outside the vocabulary".into(),
            ));
        }
        let mut st = lock(&self.state);
        if prompt.len() + 1 > st.kv.capacity() {
            return Err(ScheduleError::Executor(format!(
                "prompt of {} tokens does not fit the KV capacity {}",
                prompt.len(),
                st.kv.capacity()
            )));
        }
        st.prompt = prompt.to_vec();
        Ok(())
    }

    pub fn n_chunks(&self) -> usize {
        lock(&self.state).prompt.len().div_ceil(self.chunk)
    }

    /// Puts every block back on G1 only (the state a prefill starts from).
    pub fn reset_forms(&self) -> Result<()> {
        for g in &self.graphs {
            let mut g = lock(g);
            self.backend.unload(&mut g[1]);
            self.backend.load(&mut g[0]).map_err(rt)?;
        }
        Ok(())
    }

    /// Loads every G2 form too (the ideal run: nothing to switch).
    pub fn load_all(&self) -> Result<()> {
        for g in &self.graphs {
            let mut g = lock(g);
            self.backend.load(&mut g[0]).map_err(rt)?;
            self.backend.load(&mut g[1]).map_err(rt)?;
        }
        Ok(())
    }

    /// Prefill output: last-position logits and the KV rows of every layer for the prompt.
    pub fn output(&self) -> (Vec<f32>, Vec<f32>) {
        let st = lock(&self.state);
        let n = st.prompt.len();
        let mut kv = Vec::new();
        for layer in 0..st.kv.n_layer() {
            kv.extend(st.kv.k_rows(layer, n));
            kv.extend(st.kv.v_rows(layer, n));
        }
        (st.logits.clone(), kv)
    }

    /// Logits of the first decode step.
    pub fn decode_logits(&self) -> Vec<f32> {
        lock(&self.state).decode_logits.clone()
    }

    fn form_index(form: Form) -> usize {
        match form {
            Form::G1 => 0,
            Form::G2 => 1,
        }
    }
}

impl<B: FormBackend> ScheduleExecutor for GraphExecutor<B>
where
    B::Graph: Send,
{
    fn begin_prefill(&self) -> Result<()> {
        let mut st = lock(&self.state);
        st.kv.truncate(0).map_err(rt)?;
        if st.prompt.is_empty() {
            return Err(ScheduleError::Executor("no prompt set".into()));
        }
        Ok(())
    }

    fn compute(&self, block: usize, chunk: usize, form: Form) -> Result<()> {
        let n_blocks = self.graphs.len();
        let e = self.model.config().n_embd;
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        let start = chunk * self.chunk;
        if start >= st.prompt.len() || block >= n_blocks {
            return Err(ScheduleError::Executor(format!(
                "step (block {block}, chunk {chunk}) out of range"
            )));
        }
        let r = (st.prompt.len() - start).min(self.chunk);
        if block == 0 {
            st.tokens[..r].copy_from_slice(&st.prompt[start..start + r]);
            st.tokens[r..].fill(PAD_TOKEN);
        }
        let mut graphs = lock(&self.graphs[block]);
        let g = &mut graphs[Self::form_index(form)];
        match form {
            Form::G1 => {
                st.mask_g1.set_causal(r).map_err(rt)?;
                self.backend
                    .execute(
                        g,
                        BlockIo {
                            tokens: &st.tokens,
                            hidden: &mut st.hidden,
                            kv: &mut st.kv,
                            mask: &st.mask_g1,
                            n_past: start,
                            logits: &mut st.logits,
                            logits_rows: LogitsRows::Last,
                        },
                    )
                    .map_err(rt)?;
            }
            Form::G2 => {
                // Graph equivalence: the chunk as consecutive G2-sized runs.
                let mut off = 0;
                while off < r {
                    let rs = (r - off).min(self.g2);
                    st.mask_g2.set_causal(rs).map_err(rt)?;
                    self.backend
                        .execute(
                            g,
                            BlockIo {
                                tokens: &st.tokens[off..off + self.g2],
                                hidden: &mut st.hidden[off * e..(off + self.g2) * e],
                                kv: &mut st.kv,
                                mask: &st.mask_g2,
                                n_past: start + off,
                                logits: &mut st.logits,
                                logits_rows: LogitsRows::Last,
                            },
                        )
                        .map_err(rt)?;
                    off += rs;
                }
            }
        }
        if block + 1 == n_blocks {
            st.kv.advance(r).map_err(rt)?;
        }
        Ok(())
    }

    fn load(&self, block: usize, form: Form) -> Result<()> {
        let mut g = lock(&self.graphs[block]);
        self.backend
            .load(&mut g[Self::form_index(form)])
            .map_err(rt)
    }

    fn unload(&self, block: usize, form: Form) -> Result<()> {
        let mut g = lock(&self.graphs[block]);
        self.backend.unload(&mut g[Self::form_index(form)]);
        Ok(())
    }

    fn decode(&self) -> Result<()> {
        let e = self.model.config().n_embd;
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        let next = argmax(&st.logits);
        st.tokens[0] = next;
        st.tokens[1..self.g2].fill(PAD_TOKEN);
        st.mask_g2.set_causal(1).map_err(rt)?;
        let n_past = st.kv.n_past();
        for g in &self.graphs {
            let mut g = lock(g);
            self.backend
                .execute(
                    &mut g[1],
                    BlockIo {
                        tokens: &st.tokens[..self.g2],
                        hidden: &mut st.hidden[..self.g2 * e],
                        kv: &mut st.kv,
                        mask: &st.mask_g2,
                        n_past,
                        logits: &mut st.decode_logits,
                        logits_rows: LogitsRows::Last,
                    },
                )
                .map_err(rt)?;
        }
        Ok(())
    }

    fn form_bytes(&self, block: usize, form: Form) -> u64 {
        let g = lock(&self.graphs[block]);
        self.backend.resident_bytes(&g[Self::form_index(form)])
    }
}
