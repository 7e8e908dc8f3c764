//! The embedding-model seam. The index codes against this trait; the MiniLM and e5 adapters
//! (`crate::embed`) implement it, tests plug in small deterministic embedders.

use std::sync::Arc;

/// Turns texts into dense vectors for retrieval.
pub trait Embedder: Send + Sync {
    /// Length of every vector `embed_batch` returns.
    fn dim(&self) -> usize;
    /// Stable identifier of the model (and its preprocessing). Stored with the index:
    /// a different id forces every chunk to be embedded again.
    fn model_id(&self) -> &str;
    /// One L2-normalized vector per input text (a passage: a chunk of a document), in input
    /// order.
    fn embed_batch(&self, texts: &[&str]) -> anyhow::Result<Vec<Vec<f32>>>;
    /// The vector of a search query. Models trained with separate query and passage inputs
    /// (e5's `query: ` / `passage: ` prefixes) override it; by default a query embeds like
    /// a passage.
    fn embed_query(&self, query: &str) -> anyhow::Result<Vec<f32>> {
        self.embed_batch(&[query])?
            .into_iter()
            .next()
            .ok_or_else(|| anyhow::anyhow!("embedder returned nothing"))
    }
    /// Whether the model was trained on text in many languages. The vector an English-only
    /// model makes of a question in another language says little, so hybrid search gives
    /// the dense list of such a question no say (`Index::fuse`). Default: English only.
    fn multilingual(&self) -> bool {
        false
    }
    /// The model-cache name that loads this embedder again (`rag::embed::load_named`),
    /// stored with the index so it is searched with the model that embedded it; `None` for
    /// embedders that cannot be loaded by name (tests).
    fn name(&self) -> Option<&str> {
        None
    }
    /// The model's own token counter, so the indexer can cut chunks that fit its input
    /// window; `None` (the default) makes the indexer use corpus-tools' estimate.
    fn chunk_tokenizer(&self) -> Option<ChunkTokenizer> {
        None
    }
}

/// How an embedder counts tokens, for chunking.
#[derive(Clone)]
pub struct ChunkTokenizer {
    /// Names the tokenizer in each document's config string: a different id re-chunks.
    pub id: String,
    /// Text tokens the model reads per input (its window minus special tokens); chunks
    /// are capped at this size so no chunk's tail is cut off by the embedder.
    pub max_text_tokens: usize,
    /// Tokens of a text without special tokens. Must be additive over whitespace
    /// boundaries (true for WordPiece, and for SentencePiece up to the word mark the first
    /// word of each line gets): the chunker sums the counts of lines.
    pub count: Arc<dyn Fn(&str) -> usize + Send + Sync>,
}
