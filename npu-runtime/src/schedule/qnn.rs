//! The schedule executor on the QNN HTP backend: each form of a block is its own context
//! binary, so a switch is a real `contextFree` of the G1 context and a
//! `contextCreateFromBinary` of the G2 one (compilation is done, and cached on disk, before
//! prefill starts).
//!
//! A chunk computed on G1 in one run and on G2 as several runs gives the same bits: every
//! row attends over its own gathered view of the KV slots (`qnn::lower`, slot attention),
//! so a row's result does not depend on which rows share its run (`tests/qnn_shapes.rs`).
//! Graphs of fewer than [`QNN_MIN_PRECISE_ROWS`] rows compile to less precise HTP code, so
//! both forms must have at least that many rows.

use super::graph_exec::GraphExecutor;
use super::{Result, ScheduleError};
use crate::qnn::{BinaryCache, QnnBackend};
use crate::session::Model;
use std::sync::Arc;

pub type QnnExecutor = GraphExecutor<QnnBackend>;

/// Fewer rows than this compile to a less precise HTP graph (docs/qnn.md).
pub const QNN_MIN_PRECISE_ROWS: usize = 16;

impl GraphExecutor<QnnBackend> {
    /// Compiles (or reads from `cache`) both forms of `n_blocks` blocks for the HTP; G1
    /// contexts start loaded, G2 not. `g2` must divide `chunk` and have at least
    /// [`QNN_MIN_PRECISE_ROWS`] rows (see the module comment). Fails with the library
    /// fetch command when the QNN libraries are absent.
    pub fn new_qnn(
        model: Arc<Model>,
        n_blocks: usize,
        chunk: usize,
        g2: usize,
        kv_capacity: usize,
        cache: Option<BinaryCache>,
    ) -> Result<Self> {
        if g2 < QNN_MIN_PRECISE_ROWS {
            return Err(ScheduleError::Profile(format!(
                "on QNN the G2 graphs need at least {QNN_MIN_PRECISE_ROWS} rows (got {g2}): \
                 smaller HTP graphs compute less precisely, so a chunk on G2 would differ \
                 from the same chunk on G1"
            )));
        }
        let backend = QnnBackend::new(model.clone(), kv_capacity, cache)
            .map_err(|e| ScheduleError::Executor(e.to_string()))?;
        Self::with_backend(backend, model, n_blocks, chunk, g2, kv_capacity)
    }
}
