//! Helpers shared by the integration tests that load real models.

use npu_runtime::session::{Model, Session, SessionOptions};
use std::path::PathBuf;
use std::sync::Arc;

/// The cached model file `name`; `None` (skip) if it is missing and `RAG_SKIP_MODEL_TESTS=1`.
pub fn model_or_skip(name: &str) -> Option<PathBuf> {
    match npu_runtime::model_path::resolve(name) {
        Ok(p) => Some(p),
        Err(e) if std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping: {e}");
            None
        }
        Err(e) => panic!("{e}: run scripts/fetch-model.sh {name} (or set RAG_SKIP_MODEL_TESTS=1)"),
    }
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
