//! The schedule executor on the CPU backend. Both forms share the model's weights, so a
//! switch moves no weights: "loading" a form allocates its activation buffers, "unloading"
//! frees them; warm-up measures what that costs.

use super::graph_exec::GraphExecutor;
use super::Result;
use crate::backend::CpuBackend;
use crate::session::Model;
use std::sync::Arc;

pub type CpuExecutor = GraphExecutor<CpuBackend>;

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
