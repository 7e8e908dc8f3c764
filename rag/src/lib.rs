//! rag
pub mod embed;
pub mod embed_api;
pub mod models;
