//! What the `rag` binary and the `rag-bench` benchmarks (`cli/bench`) share: the backend
//! flags, the embedder they load, how indexing reports itself and the `--kv-cache` parser;
//! and the config file and exit codes of `rag`.

pub mod backend_args;
pub mod config;
pub mod embedder;
pub mod exit;
pub mod index_progress;

/// `--kv-cache` (clap has already limited it to f32 / f16).
pub fn kv_precision(s: &str) -> anyhow::Result<npu_runtime::session::KvPrecision> {
    npu_runtime::session::KvPrecision::parse(s)
        .ok_or_else(|| anyhow::anyhow!("--kv-cache {s}: expected f32 or f16"))
}
