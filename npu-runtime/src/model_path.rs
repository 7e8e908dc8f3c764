//! Resolve a model argument (a path, or a name from `models/manifest.tsv`) to a file.

use crate::error::{Result, RuntimeError};
use std::path::PathBuf;

const MANIFEST: &str = include_str!("../../models/manifest.tsv");

/// The model cache: `$RAG_MODEL_DIR`, else `~/.cache/rag/models`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RAG_MODEL_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/rag/models")
}

/// Output file name of a manifest entry.
fn manifest_file(name: &str) -> Option<String> {
    MANIFEST
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split('\t').collect::<Vec<_>>())
        .find(|f| f.len() >= 5 && f[0] == name)
        .map(|f| f[4].to_string())
}

/// An existing file path is returned as is; a manifest name maps to its file in the cache.
pub fn resolve(name_or_path: &str) -> Result<PathBuf> {
    let p = PathBuf::from(name_or_path);
    if p.is_file() {
        return Ok(p);
    }
    if let Some(file) = manifest_file(name_or_path) {
        let path = cache_dir().join(file);
        if path.exists() {
            return Ok(path);
        }
        return Err(RuntimeError::Model(format!(
            "model '{name_or_path}' is not downloaded (expected {}); run `rag model pull {name_or_path}` \
             (or scripts/fetch-model.sh {name_or_path})",
            path.display()
        )));
    }
    Err(RuntimeError::Model(format!(
        "'{name_or_path}' is neither a model file nor a known model name (see `rag model list`)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_names_map_to_files() {
        assert_eq!(
            manifest_file("smollm2-135m").as_deref(),
            Some("smollm2-135m.gguf")
        );
        assert!(manifest_file("no-such-model").is_none());
        let e = resolve("no-such-model").unwrap_err().to_string();
        assert!(e.contains("neither"), "{e}");
    }
}
