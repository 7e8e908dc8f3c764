//! The `--backend` flags shared by `rag ask` and `rag generate`.

use anyhow::Result;
use rag::engine::{BackendChoice, QnnShapes, QNN_PREFILL_ROWS, QNN_VERIFY_ROWS};

#[derive(clap::Args, Clone, Debug)]
pub struct BackendArgs {
    /// Where the block graphs run: `cpu`, or `qnn` (Qualcomm HTP NPU; on x86-64 the
    /// emulator from `scripts/fetch-model.sh qnn-htp`, very slow). Speculative decoding
    /// verifies its token trees on the same backend.
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "qnn"])]
    pub backend: String,
    /// QNN: rows of the prefill graphs.
    #[arg(long, default_value_t = QNN_PREFILL_ROWS)]
    pub qnn_prefill_rows: usize,
    /// QNN: rows of the decode/verify graphs (a power of two; 16 or more for the
    /// precise HTP graphs).
    #[arg(long, default_value_t = QNN_VERIFY_ROWS)]
    pub qnn_verify_rows: usize,
    /// QNN: number of blocks (graphs per shape) the layers are split into.
    #[arg(long, default_value_t = 2)]
    pub qnn_blocks: usize,
    /// QNN: KV slots of the compiled graphs (a static shape: every graph attends over
    /// all of them, so it bounds prompt + answer and sets the attention cost).
    #[arg(long, default_value_t = 1024)]
    pub qnn_kv: usize,
    /// Residency budget of the block graphs in MB. When the prefill and the decode graphs
    /// of every block do not fit together, the prefill switches blocks from one to the
    /// other progressively, hidden behind compute (`--json` reports `switching`).
    /// Default: 4096 on `qnn` (the 1.5B switches, SmolLM2 does not); none on `cpu`.
    #[arg(long, value_name = "MB")]
    pub npu_memory_mb: Option<u64>,
}

impl BackendArgs {
    pub fn choice(&self) -> Result<BackendChoice> {
        Ok(match self.backend.as_str() {
            "qnn" => BackendChoice::Qnn(QnnShapes {
                prefill_rows: self.qnn_prefill_rows,
                verify_rows: self.qnn_verify_rows,
                blocks: self.qnn_blocks,
                ..QnnShapes::default()
            }),
            other => BackendChoice::parse(other)?,
        })
    }

    /// The residency budget in MB, if the prefill should switch graphs under one.
    pub fn budget_mb(&self) -> Result<Option<u64>> {
        Ok(rag::engine::memory_budget_mb(
            &self.choice()?,
            self.npu_memory_mb,
        ))
    }

    /// The KV capacity the backend fixes (QNN's graph shape), if any.
    pub fn kv_capacity(&self) -> Option<usize> {
        (self.backend == "qnn").then_some(self.qnn_kv)
    }
}
