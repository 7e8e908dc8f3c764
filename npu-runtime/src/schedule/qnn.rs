//! The schedule executor on the QNN HTP backend: each form of a block is its own context
//! binary, so a switch is a real `contextFree` of the G1 context and a
//! `contextCreateFromBinary` of the G2 one (compilation is done, and cached on disk, before
//! prefill starts).
//!
//! On the HTP a row's outputs depend on how the prompt is cut into runs (measured on the
//! emulator, `tests/qnn_shapes.rs`): rows that arrive in the same run attend to each other
//! through the graph's new-row columns, rows of earlier runs through the cache columns, and
//! the two orders of fp16 accumulation differ in the last bits. Graphs of >= 16 rows compute
//! a given run bit-identically whatever their size (padding rows are inert), graphs of fewer
//! rows at lower precision. So the schedules produce identical outputs only when the G2 form
//! computes a chunk in one run, as G1 does: [`GraphExecutor::new_qnn`] requires the G2 size
//! to equal the chunk, and single decode tokens then run padded on that graph.

use super::graph_exec::{FormBackend, GraphExecutor};
use super::{Result, ScheduleError};
use crate::qnn::{BinaryCache, QnnBackend, QnnGraph};
use crate::session::Model;
use std::sync::Arc;

pub type QnnExecutor = GraphExecutor<QnnBackend>;

/// Fewer rows than this compile to a less precise HTP graph (docs/qnn.md).
pub const QNN_MIN_PRECISE_ROWS: usize = 16;

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
    /// contexts start loaded, G2 not. `g2` must equal `chunk` (see the module comment: any
    /// other G2 size makes the prefill output depend on the schedule); chunks of at least
    /// [`QNN_MIN_PRECISE_ROWS`] get the precise HTP graphs. Fails with the library fetch
    /// command when the QNN libraries are absent.
    pub fn new_qnn(
        model: Arc<Model>,
        n_blocks: usize,
        chunk: usize,
        g2: usize,
        kv_capacity: usize,
        cache: Option<BinaryCache>,
    ) -> Result<Self> {
        if g2 != chunk {
            return Err(ScheduleError::Profile(format!(
                "on QNN the G2 size ({g2}) must equal the chunk ({chunk}): the HTP's results \
                 depend on how rows are cut into runs, so a chunk computed as several G2 runs \
                 would differ from the same chunk on G1 (use e.g. --chunk 16 --g2 16)"
            )));
        }
        let backend = QnnBackend::new(model.clone(), kv_capacity, cache)
            .map_err(|e| ScheduleError::Executor(e.to_string()))?;
        Self::with_backend(backend, model, n_blocks, chunk, g2, kv_capacity)
    }
}
