//! Helpers shared by the integration tests that run the `rag` binary.
// Each test file uses its own subset.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `rag` binary built for these tests, with `args`.
pub fn rag(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rag"));
    c.args(args);
    c
}

/// Runs `c` and fails the test with its stderr unless it succeeded.
pub fn run_ok(c: &mut Command) -> Output {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{c:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The sample corpus shipped in `examples/`.
pub fn sample_corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/sample-corpus")
}

/// Whether smollm2-135m is installed; missing, it fails the test unless
/// `RAG_SKIP_MODEL_TESTS=1`.
pub fn model_available() -> bool {
    let present = rag::models::resolve("smollm2-135m").is_ok();
    if !present && std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() != Ok("1") {
        panic!("smollm2-135m is missing: run scripts/fetch-model.sh smollm2-135m");
    }
    present
}

/// Indexes the sample corpus into `idx` (BM25 only: no embedder needed).
pub fn index_sample(idx: &Path) -> Output {
    run_ok(
        rag(&["index", "--no-dense", "--index-dir"])
            .arg(idx)
            .arg(sample_corpus()),
    )
}
