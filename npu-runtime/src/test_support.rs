//! Helpers for the integration tests of this crate and of the backends built on it (the
//! `test-support` feature; crates cannot share their `tests/` modules): fp16 tensor bytes,
//! deterministic inputs, the cached model files and a logits fingerprint of a model.

use crate::session::{LoadOptions, Model, Session, SessionOptions};
use half::f16;
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

/// Deterministic 64-bit words (xorshift64 from `state`, which must not be 0), so failures
/// reproduce.
pub fn xorshift(mut state: u64) -> impl Iterator<Item = u64> {
    std::iter::repeat_with(move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    })
}

/// Deterministic values in [-1, 1).
pub fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        .take(n)
        .map(|s| ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
        .collect()
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

/// Logit bits after a 20-token prefill and one decode step: every matrix of every layer
/// and the vocabulary matrices take part in them.
pub fn logit_bits(model: &Arc<Model>) -> Vec<u32> {
    let opts = SessionOptions {
        kv_capacity: 64,
        ..SessionOptions::default()
    };
    let mut s = Session::new(model.clone(), opts).unwrap();
    let tokens: Vec<u32> = (0..21u32).map(|i| 100 + (i * 7919) % 20000).collect();
    let prefill = s.prefill(&tokens[..20], 0).unwrap();
    let mut bits: Vec<u32> = prefill.logits.iter().map(|v| v.to_bits()).collect();
    bits.extend(
        s.decode_step(tokens[20])
            .unwrap()
            .iter()
            .map(|v| v.to_bits()),
    );
    bits
}
