//! Shared by the QNN integration tests: fp16 tensor bytes, deterministic inputs, the
//! emulator check, the cached SmolLM2 model and the exact f64 reference (`oracle`).
#![allow(dead_code, unused_imports)]

pub mod oracle;

pub use npu_runtime::test_support::{h, model_file, model_or_skip, rand_vec, smollm2, unh};

/// Whether the QNN HTP libraries can be loaded. When they are absent the test fails with the
/// fetch command in the message, unless RAG_SKIP_QNN_TESTS=1 asks to skip it.
pub fn qnn_available() -> bool {
    match npu_qnn::runtime() {
        Ok(_) => true,
        Err(e) if std::env::var("RAG_SKIP_QNN_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping QNN test: {e}");
            false
        }
        Err(e) => panic!("{e} (set RAG_SKIP_QNN_TESTS=1 to skip QNN tests)"),
    }
}
