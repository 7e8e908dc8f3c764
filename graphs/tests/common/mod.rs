//! Shared helpers for the graphs integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// Directory holding the test models: `$RAG_MODEL_DIR` or `~/.cache/rag/models`.
pub fn model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RAG_MODEL_DIR") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/rag/models")
}

/// Path of a model file, `None` when model tests are skipped
/// (`RAG_SKIP_MODEL_TESTS=1`). Panics with instructions when the file is missing.
pub fn model(file: &str, fetch_name: &str) -> Option<PathBuf> {
    if std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        return None;
    }
    let p = model_dir().join(file);
    assert!(
        p.exists(),
        "model file {} is missing: run `scripts/fetch-model.sh {fetch_name}` \
         (or set RAG_SKIP_MODEL_TESTS=1 to skip model tests)",
        p.display()
    );
    Some(p)
}

pub fn smollm2() -> Option<PathBuf> {
    model("smollm2-135m.gguf", "smollm2-135m")
}

pub fn qwen05() -> Option<PathBuf> {
    model("qwen2.5-coder-0.5b.gguf", "qwen2.5-coder-0.5b")
}

/// Deterministic xorshift generator (tests must not depend on an RNG crate).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}
