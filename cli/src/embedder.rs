//! The embedding model `rag index`, `rag search`, `rag ask` and the retrieval benchmarks
//! load: MiniLM from the model cache, or none for BM25-only retrieval.

use anyhow::{bail, Result};
use rag::Embedder;
use std::path::PathBuf;
use std::sync::Arc;

/// The embedding model directory: `$RAG_MODEL_DIR/minilm-l6-v2` or the user cache.
fn embedder_dir() -> PathBuf {
    rag::models::cache_dir().join(rag::models::DEFAULT_EMBEDDER)
}

/// Load the MiniLM embedder, or None with `no_dense`. A missing model is a clear error.
pub fn load_embedder(no_dense: bool) -> Result<Option<Arc<dyn Embedder>>> {
    if no_dense {
        return Ok(None);
    }
    let dir = embedder_dir();
    if !dir.join("model.safetensors").is_file() || !dir.join("tokenizer.json").is_file() {
        bail!(
            "embedding model not found in {}: run `scripts/fetch-model.sh minilm-l6-v2` (or `rag model pull minilm-l6-v2`), or pass --no-dense for BM25-only retrieval",
            dir.display()
        );
    }
    let e = rag::embed::MiniLmEmbedder::load_with(&dir, embed_format()?)?;
    Ok(Some(Arc::new(e)))
}

/// Weight format of the embedder (`RAG_EMBED_FORMAT`, see [`rag::embed::configured_format`]).
pub fn embed_format() -> Result<rag::embed::WeightFormat> {
    rag::embed::configured_format()
}
