//! The schedule executor on the CPU backend. Both forms share the model's weights, so a
//! switch moves no weights: "loading" a form allocates its activation buffers, "unloading"
//! frees them; warm-up measures what that costs.

use super::graph_exec::{FormBackend, GraphExecutor};
use super::Result;
use crate::backend::{Backend, CpuBackend, CpuGraph};
use crate::session::Model;
use std::sync::Arc;

pub type CpuExecutor = GraphExecutor<CpuBackend>;

impl FormBackend for CpuBackend {
    /// Activation buffers of the form (the weights are shared by both forms).
    fn form_bytes(&self, graph: &CpuGraph) -> u64 {
        let c = self.model().config();
        let t = self.shape(graph).tokens as u64;
        let q = (c.n_head * c.head_dim) as u64;
        let kv = (c.n_head_kv * c.head_dim) as u64;
        let per_token = 2 * c.n_embd as u64 + 3 * q + 2 * kv + 2 * c.n_ff as u64;
        4 * t * per_token
    }
}

impl GraphExecutor<CpuBackend> {
    /// Compiles both forms of `n_blocks` blocks on the CPU; G1 forms start resident, G2 not.
    pub fn new(
        model: Arc<Model>,
        n_blocks: usize,
        chunk: usize,
        g2: usize,
        kv_capacity: usize,
    ) -> Result<Self> {
        let backend = CpuBackend::new(model.clone(), kv_capacity);
        Self::with_backend(backend, model, n_blocks, chunk, g2, kv_capacity)
    }
}
