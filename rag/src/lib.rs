//! rag
