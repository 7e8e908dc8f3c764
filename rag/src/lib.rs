//! rag
pub mod ann;
pub mod assistant;
pub mod bm25;
pub mod embed;
pub mod embed_api;
pub mod hybrid;
pub mod index;
pub mod models;
pub mod prompt;
pub mod store;

pub use embed_api::Embedder;
pub use index::{
    Chunk, Hit, Index, IndexOptions, IndexProgress, IndexStats, IndexSummary, Phase, SearchMode,
};
