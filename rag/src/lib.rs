//! rag
pub mod embed_api;
pub mod models;
