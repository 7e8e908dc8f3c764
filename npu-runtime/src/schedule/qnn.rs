//! The schedule executor on the QNN HTP backend: each form of a block is its own context
//! binary, so a switch is a real `contextFree` of the G1 context and a
//! `contextCreateFromBinary` of the G2 one (compilation is done, and cached on disk, before
//! prefill starts).

use super::graph_exec::{FormBackend, GraphExecutor};
use super::{Result, ScheduleError};
use crate::qnn::{BinaryCache, QnnBackend, QnnGraph};
use crate::session::Model;
use std::sync::Arc;

pub type QnnExecutor = GraphExecutor<QnnBackend>;

impl FormBackend for QnnBackend {
    /// The context binary (fp16 weights and the finalized graph) plus the host staging
    /// buffers of its inputs and outputs.
    fn form_bytes(&self, graph: &QnnGraph) -> u64 {
        let io: usize = graph
            .inputs()
            .iter()
            .chain(graph.outputs())
            .map(|t| t.bytes())
            .sum();
        (graph.times().binary_bytes + io) as u64
    }
}

impl GraphExecutor<QnnBackend> {
    /// Compiles (or reads from `cache`) both forms of `n_blocks` blocks for the HTP; G1
    /// contexts start loaded, G2 not. Fails with the library fetch command when the QNN
    /// libraries are absent.
    pub fn new_qnn(
        model: Arc<Model>,
        n_blocks: usize,
        chunk: usize,
        g2: usize,
        kv_capacity: usize,
        cache: Option<BinaryCache>,
    ) -> Result<Self> {
        let backend = QnnBackend::new(model.clone(), kv_capacity, cache)
            .map_err(|e| ScheduleError::Executor(e.to_string()))?;
        Self::with_backend(backend, model, n_blocks, chunk, g2, kv_capacity)
    }
}
