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
