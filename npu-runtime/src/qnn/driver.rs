//! A small greedy-generation driver over any [`Backend`]: one prefill-chunk graph set and
//! one single-token decode graph set, a host KV cache, causal or tree masks. The CPU
//! [`crate::session::Session`] is tied to the CPU backend; this driver lets the QNN backend
//! (and, in tests, the CPU backend for comparison) run whole models.

use crate::attention::BatchMask;
use crate::backend::{Backend, BlockIo, LogitsRows, PAD_TOKEN};
use crate::error::{Result, RuntimeError};
use crate::kv_cache::KvCache;
use crate::session::{argmax, Model};
use graphs::ir::{BlockSpec, GraphShape};
use std::sync::Arc;
use std::time::Instant;

pub struct BlockRunner<B: Backend> {
    backend: B,
    model: Arc<Model>,
    kv: KvCache,
    mask: BatchMask,
    chunk: usize,
    /// Graphs of the prefill shape (`chunk` tokens), one per block.
    prefill: Vec<B::Graph>,
    /// Graphs of the decode shape (1 token), one per block; empty when `chunk == 1` or
    /// built with [`BlockRunner::prefill_only`].
    decode: Vec<B::Graph>,
    tokens: Vec<u32>,
    hidden: Vec<f32>,
    logits: Vec<f32>,
}

impl<B: Backend> BlockRunner<B> {
    /// Compiles and loads `n_blocks` blocks at the prefill shape (`chunk` tokens) and the
    /// decode shape (1 token), both with `kv_capacity` slots.
    pub fn new(
        backend: B,
        model: Arc<Model>,
        n_blocks: usize,
        chunk: usize,
        kv_capacity: usize,
    ) -> Result<Self> {
        Self::build(backend, model, n_blocks, chunk, kv_capacity, true)
    }

    /// Like [`BlockRunner::new`] without the single-token graphs: decode steps run on the
    /// prefill graphs (one valid row, the rest padding). Half the compile work, for callers
    /// that mostly prefill or verify token trees.
    pub fn prefill_only(
        backend: B,
        model: Arc<Model>,
        n_blocks: usize,
        chunk: usize,
        kv_capacity: usize,
    ) -> Result<Self> {
        Self::build(backend, model, n_blocks, chunk, kv_capacity, false)
    }

    fn build(
        backend: B,
        model: Arc<Model>,
        n_blocks: usize,
        chunk: usize,
        kv_capacity: usize,
        decode_graphs: bool,
    ) -> Result<Self> {
        let c = model.config().clone();
        if chunk == 0 || chunk > kv_capacity || kv_capacity > c.ctx_len {
            return Err(RuntimeError::InvalidInput(format!(
                "chunk {chunk} / kv_capacity {kv_capacity} must satisfy 1 <= chunk <= kv_capacity <= {}",
                c.ctx_len
            )));
        }
        let blocks = BlockSpec::split(c.n_layer, n_blocks);
        let make = |t: usize| -> Result<Vec<B::Graph>> {
            let mut v = Vec::with_capacity(blocks.len());
            for b in &blocks {
                let mut g = backend.compile(b, GraphShape::new(t, kv_capacity))?;
                backend.load(&mut g)?;
                v.push(g);
            }
            Ok(v)
        };
        let prefill = make(chunk)?;
        let decode = if chunk == 1 || !decode_graphs {
            Vec::new()
        } else {
            make(1)?
        };
        Ok(BlockRunner {
            kv: KvCache::new(c.n_layer, c.n_head_kv, c.head_dim, kv_capacity),
            mask: BatchMask::new(chunk),
            tokens: vec![PAD_TOKEN; chunk],
            hidden: vec![0.0; chunk * c.n_embd],
            logits: vec![0.0; chunk * c.vocab_size],
            backend,
            model,
            chunk,
            prefill,
            decode,
        })
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn n_past(&self) -> usize {
        self.kv.n_past()
    }

    /// Forgets the context (the graphs stay loaded).
    pub fn reset(&mut self) -> Result<()> {
        self.kv.truncate(0)
    }

    /// Prefill-shape graphs then decode-shape graphs, block order.
    pub fn graphs(&self) -> impl Iterator<Item = &B::Graph> {
        self.prefill.iter().chain(&self.decode)
    }

    pub fn graphs_mut(&mut self) -> (&B, &mut [B::Graph], &mut [B::Graph]) {
        (&self.backend, &mut self.prefill, &mut self.decode)
    }

    fn run(&mut self, decode: bool, rows: LogitsRows) -> Result<()> {
        let t = if decode && !self.decode.is_empty() {
            1
        } else {
            self.chunk
        };
        let e = self.model.config().n_embd;
        let graphs = if t == 1 && !self.decode.is_empty() {
            &mut self.decode
        } else {
            &mut self.prefill
        };
        let n_past = self.kv.n_past();
        for g in graphs.iter_mut() {
            self.backend.execute(
                g,
                BlockIo {
                    tokens: &self.tokens[..t],
                    hidden: &mut self.hidden[..t * e],
                    kv: &mut self.kv,
                    mask: &self.mask,
                    n_past,
                    logits: &mut self.logits,
                    logits_rows: rows,
                },
            )?;
        }
        Ok(())
    }

    fn check(&self, tokens: &[u32]) -> Result<()> {
        let v = self.model.vocab_size();
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= v) {
            return Err(RuntimeError::InvalidInput(format!(
                "token id {t} outside the vocabulary of {v}"
            )));
        }
        if tokens.len() > self.kv.free() {
            return Err(RuntimeError::Capacity(format!(
                "{} new tokens do not fit: {} of {} KV slots used",
                tokens.len(),
                self.kv.n_past(),
                self.kv.capacity()
            )));
        }
        Ok(())
    }

    /// Causal prefill in chunks (the last one padded); returns the last position's logits.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        if tokens.is_empty() {
            return Err(RuntimeError::InvalidInput(
                "prefill of an empty prompt".into(),
            ));
        }
        self.check(tokens)?;
        for part in tokens.chunks(self.chunk) {
            let r = part.len();
            self.tokens[..r].copy_from_slice(part);
            self.tokens[r..].fill(PAD_TOKEN);
            self.mask.set_causal(r)?;
            self.run(false, LogitsRows::Last)?;
            self.kv.advance(r)?;
        }
        Ok(&self.logits[..self.model.vocab_size()])
    }

    /// One token through the decode graphs; returns its logits.
    pub fn decode_step(&mut self, token: u32) -> Result<&[f32]> {
        self.check(&[token])?;
        self.tokens[0] = token;
        self.tokens[1..].fill(PAD_TOKEN);
        self.mask.set_causal(1)?;
        self.run(true, LogitsRows::Last)?;
        self.kv.advance(1)?;
        Ok(&self.logits[..self.model.vocab_size()])
    }

    /// Logits of every node of a token tree (parents: -1 = child of the committed context)
    /// on the prefill graphs, without committing anything.
    pub fn forward_tree(&mut self, tokens: &[u32], parents: &[i32]) -> Result<&[f32]> {
        if tokens.is_empty() || tokens.len() > self.chunk || tokens.len() != parents.len() {
            return Err(RuntimeError::InvalidInput(format!(
                "a tree of 1..={} nodes with one parent each",
                self.chunk
            )));
        }
        self.check(tokens)?;
        let n = tokens.len();
        self.tokens[..n].copy_from_slice(tokens);
        self.tokens[n..].fill(PAD_TOKEN);
        self.mask.set_tree(parents)?;
        self.run(false, LogitsRows::All)?;
        Ok(&self.logits[..n * self.model.vocab_size()])
    }
}

/// Timings of [`generate_greedy`].
#[derive(Clone, Debug)]
pub struct RunnerStats {
    pub prompt_tokens: usize,
    pub generated: usize,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub decode_steps: usize,
}

/// Greedy decoding of up to `max_tokens` tokens after prefilling `prompt`; stops at an
/// end-of-generation token, a full cache, or when `on_token` returns false.
pub fn generate_greedy<B: Backend>(
    r: &mut BlockRunner<B>,
    prompt: &[u32],
    max_tokens: usize,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<RunnerStats> {
    let t0 = Instant::now();
    let mut tok = argmax(r.prefill(prompt)?);
    let prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t1 = Instant::now();
    let (mut generated, mut steps) = (0, 0);
    while generated < max_tokens && !r.model.is_eog(tok) {
        generated += 1;
        if !on_token(tok) || generated == max_tokens || r.kv.free() == 0 {
            break;
        }
        tok = argmax(r.decode_step(tok)?);
        steps += 1;
    }
    Ok(RunnerStats {
        prompt_tokens: prompt.len(),
        generated,
        prefill_ms,
        decode_ms: t1.elapsed().as_secs_f64() * 1e3,
        decode_steps: steps,
    })
}
