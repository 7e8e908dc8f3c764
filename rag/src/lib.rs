//! rag: a local retrieval-augmented assistant.
//!
//! - [`Index`]: the on-disk index of a document folder (SQLite store, BM25, HNSW), built
//!   incrementally and crash-safely by [`Index::add_paths`], searched by [`Index::search`]
//!   (BM25, dense or hybrid).
//! - [`assistant::Assistant`]: the index plus a local LLM behind one thread-safe handle:
//!   open/create, add/remove documents, retrieve, ask with a token stream and cancellation,
//!   ask with caller-supplied context. Start there.
//! - [`prompt`]: numbered sources under a token budget; retrieved text stays data.
//! - [`select`]: choosing one answer among several samples (vote, confidence).
//! - [`models`]: the model manifest and the cache (fetch on first use).
//! - [`engine`]: the generation engine (the runtime's session on the CPU or the QNN HTP).
pub mod ann;
pub mod assistant;
pub mod bm25;
mod bm25_guard;
pub mod embed;
pub mod embed_api;
mod embed_e5;
pub mod engine;
pub mod hybrid;
pub mod index;
pub mod index_files;
pub mod lang;
pub mod models;
pub mod prompt;
pub mod prompt_head;
pub mod select;
pub mod stop;
pub mod store;

pub use embed_api::Embedder;
pub use index::{
    Chunk, Hit, Index, IndexOptions, IndexProgress, IndexRoot, IndexStats, IndexSummary, Phase,
    SearchMode, SkippedFile,
};
