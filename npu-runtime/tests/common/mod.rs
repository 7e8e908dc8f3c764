//! Shared by the QNN integration tests.
#![allow(dead_code)]

pub mod oracle;

use npu_runtime::qnn;

/// Whether the QNN HTP libraries can be loaded. When they are absent the test fails with the
/// fetch command in the message, unless RAG_SKIP_QNN_TESTS=1 asks to skip it.
pub fn qnn_available() -> bool {
    match qnn::runtime() {
        Ok(_) => true,
        Err(e) if std::env::var("RAG_SKIP_QNN_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping QNN test: {e}");
            false
        }
        Err(e) => panic!("{e} (set RAG_SKIP_QNN_TESTS=1 to skip QNN tests)"),
    }
}

/// SmolLM2-135M from the model cache. A missing model fails with the fetch command, unless
/// RAG_SKIP_MODEL_TESTS=1 asks to skip (then `None`).
pub fn smollm2() -> Option<std::sync::Arc<npu_runtime::session::Model>> {
    use npu_runtime::session::{LoadOptions, Model};
    match npu_runtime::model_path::resolve("smollm2-135m") {
        Ok(p) => Some(Model::load(&p, &LoadOptions::default()).unwrap()),
        Err(e) if std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping: {e}");
            None
        }
        Err(e) => {
            panic!("{e}: run scripts/fetch-model.sh smollm2-135m (or set RAG_SKIP_MODEL_TESTS=1)")
        }
    }
}
