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

/// `--mode`: the search modes as clap choices, so `--help` lists them and a bad value
/// is a usage error (exit 2) that names them.
pub fn search_mode_parser() -> impl clap::builder::TypedValueParser<Value = rag::SearchMode> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["hybrid", "bm25", "dense"])
        .map(|s| s.parse().expect("every listed mode parses"))
}
