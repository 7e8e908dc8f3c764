//! Errors of the QNN backend, with the QNN error code when a call failed.

use npu_runtime::error::RuntimeError;
use std::path::PathBuf;

#[derive(Clone, Debug, thiserror::Error)]
pub enum QnnError {
    /// The HTP libraries are not installed where we look for them.
    #[error(
        "QNN HTP libraries not found ({0}); install them with `scripts/fetch-model.sh qnn-htp` \
         (or point RAG_QNN_LIB_DIR at a directory holding onnxruntime_qnn/libQnnHtp.so)"
    )]
    LibsMissing(PathBuf),
    /// dlopen / symbol lookup failed.
    #[error("loading the QNN library {path}: {msg}")]
    Load { path: PathBuf, msg: String },
    /// The library speaks a core API we were not written against.
    #[error("QNN provider {provider} has core API {found}, these bindings need {expected}")]
    Version {
        provider: String,
        found: String,
        expected: String,
    },
    /// A QNN call returned an error code.
    #[error("QNN {call} failed with error {code} (0x{code:x})")]
    Call { call: &'static str, code: u64 },
    /// Our own misuse caught before calling QNN (shapes, sizes, names).
    #[error("QNN: {0}")]
    Invalid(String),
}

impl QnnError {
    /// The QNN error code of a failed call (low 16 bits), if this is one.
    pub fn code(&self) -> Option<u64> {
        match self {
            QnnError::Call { code, .. } => Some(code & 0xFFFF),
            _ => None,
        }
    }
}

impl From<QnnError> for RuntimeError {
    fn from(e: QnnError) -> Self {
        RuntimeError::Backend(e.to_string())
    }
}

pub type QnnResult<T> = std::result::Result<T, QnnError>;
