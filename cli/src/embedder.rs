//! The embedding model `rag index`, `rag search`, `rag ask` and the retrieval benchmarks
//! load: the one an index was built with (or the one `--embedder` names) from the model cache,
//! or none for BM25-only retrieval.

use anyhow::{bail, Result};
use rag::Embedder;
use std::path::Path;
use std::sync::Arc;

/// Load the embedder for the index at `index_dir`: `requested` (`--embedder NAME`), else
/// the one the index was embedded with, else MiniLM; None with `no_dense`. A model that is
/// not cached is a clear error naming the fetch command.
pub fn load_embedder(
    no_dense: bool,
    index_dir: &Path,
    requested: Option<&str>,
) -> Result<Option<Arc<dyn Embedder>>> {
    if no_dense {
        return Ok(None);
    }
    let name = rag::embed::choose_embedder(index_dir, requested)?;
    let cached = rag::models::find(&name).is_some_and(|e| e.is_cached());
    if !cached {
        bail!(
            "embedding model {name} not found in {}: run `scripts/fetch-model.sh {name}` (or `rag model pull {name}`), or pass --no-dense for BM25-only retrieval",
            rag::models::cache_dir().display()
        );
    }
    Ok(Some(rag::embed::load_named_with(&name, embed_format()?)?))
}

/// Weight format of the embedder (`RAG_EMBED_FORMAT`, see [`rag::embed::configured_format`]).
pub fn embed_format() -> Result<rag::embed::WeightFormat> {
    rag::embed::configured_format()
}
