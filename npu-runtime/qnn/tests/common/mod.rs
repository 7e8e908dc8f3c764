//! Shared by the QNN integration tests: fp16 tensor bytes, deterministic inputs, the
//! emulator check, the cached SmolLM2 model and the exact f64 reference (`oracle`).
#![allow(dead_code)]

pub mod oracle;

use half::f16;
use npu_runtime::session::{LoadOptions, Model};
use std::path::PathBuf;
use std::sync::Arc;

/// f32 values as the little-endian fp16 bytes QNN tensors take.
pub fn h(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| f16::from_f32(*x).to_le_bytes())
        .collect()
}

/// Little-endian fp16 bytes back to f32.
pub fn unh(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2)
        .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect()
}

/// Deterministic values in [-1, 1) (xorshift), so failures reproduce.
pub fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

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

/// SmolLM2-135M from the model cache. A missing model fails with the fetch command, unless
/// RAG_SKIP_MODEL_TESTS=1 asks to skip (then `None`).
pub fn smollm2() -> Option<Arc<Model>> {
    model_or_skip("smollm2-135m").map(|p| Model::load(&p, &LoadOptions::default()).unwrap())
}

/// Where model `name` is cached: `$RAG_MODEL_DIR/<name>.gguf`, else
/// `~/.cache/rag/models/<name>.gguf` (the runtime knows no model names; `rag::models` does).
pub fn model_file(name: &str) -> PathBuf {
    let dir = std::env::var_os("RAG_MODEL_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/rag/models")
        });
    dir.join(format!("{name}.gguf"))
}

/// The cached model file `name`. A missing one fails with the fetch command, unless
/// `RAG_SKIP_MODEL_TESTS=1` asks to skip (then `None`).
pub fn model_or_skip(name: &str) -> Option<PathBuf> {
    let p = model_file(name);
    if p.is_file() {
        return Some(p);
    }
    if std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!(
            "skipping: {} missing and RAG_SKIP_MODEL_TESTS=1",
            p.display()
        );
        return None;
    }
    panic!(
        "{} missing: run scripts/fetch-model.sh {name} (or set RAG_SKIP_MODEL_TESTS=1)",
        p.display()
    );
}
