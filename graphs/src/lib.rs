//! Model description: GGUF reading, quantization formats (with scalar reference
//! dequantization), model configuration, tokenizer and chat template, and the
//! static-shape block-graph IR. Knows nothing about backends.

pub mod chat;
pub mod config;
pub mod fnv;
pub mod gguf;
pub mod ir;
pub mod quant;
pub mod tokenizer;
