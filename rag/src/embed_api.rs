//! The embedding-model seam. The index codes against this trait; the MiniLM adapter
//! (`crate::embed`) implements it, tests plug in small deterministic embedders.

/// Turns texts into dense vectors for retrieval.
pub trait Embedder: Send + Sync {
    /// Length of every vector `embed_batch` returns.
    fn dim(&self) -> usize;
    /// Stable identifier of the model (and its preprocessing). Stored with the index:
    /// a different id forces every chunk to be embedded again.
    fn model_id(&self) -> &str;
    /// One L2-normalized vector per input text, in input order.
    fn embed_batch(&self, texts: &[&str]) -> anyhow::Result<Vec<Vec<f32>>>;
}
