//! The default root of the runtime's QNN library location ([`crate::qnn::library::lib_dir`]).
//! Model names, the manifest and the model cache belong to `rag::models`; this copy of its
//! cache root remains only because `lib_dir` falls back to `qnn-htp/` inside it.

use std::path::PathBuf;

/// `$RAG_MODEL_DIR`, else `~/.cache/rag/models` (as `rag::models::cache_dir`).
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RAG_MODEL_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/rag/models")
}
