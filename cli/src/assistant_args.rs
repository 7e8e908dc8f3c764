//! The flags `rag ask`, `rag chat` and `rag serve` share: the index, the model and how it
//! runs, and what each question retrieves. Every default is the library's
//! (`rag::assistant`), so the commands behave as `Assistant` does when told nothing.

use anyhow::Result;
use npu_runtime::session::KvPrecision;
use npu_runtime::weights_cache::WeightsCache;
use rag::assistant::{AskOptions, AssistantOptions, DEFAULT_CONTEXT_TOKENS, DEFAULT_TOP_K};
use rag::SearchMode;
use rag_cli::backend_args::BackendArgs;
use std::path::PathBuf;

/// Where `rag index`, `rag search` and the assistant commands keep the index.
pub const DEFAULT_INDEX_DIR: &str = ".rag-index";

#[derive(clap::Args)]
pub struct AssistantArgs {
    /// Where the index lives.
    #[arg(long, default_value = DEFAULT_INDEX_DIR)]
    pub index_dir: PathBuf,
    /// Model name (fetched on first use) or path to a GGUF file.
    #[arg(long, default_value = rag::models::DEFAULT_MODEL)]
    pub model: String,
    /// Passages retrieved for each question (the prompt's numbered sources).
    #[arg(long, short = 'k', default_value_t = DEFAULT_TOP_K)]
    pub top_k: usize,
    /// hybrid (BM25 + dense, fused), bm25 or dense.
    #[arg(long, default_value_t = AskOptions::default().mode)]
    pub mode: SearchMode,
    /// BM25 only: do not load the embedding model (`rag serve`: no /v1/embeddings).
    #[arg(long)]
    pub no_dense: bool,
    /// Token budget for the numbered sources in the prompt.
    #[arg(long, default_value_t = DEFAULT_CONTEXT_TOKENS)]
    pub context_tokens: usize,
    /// Speculative decoding: none, pld, sam or sdnpu (the answer is the same; speed differs).
    #[arg(long, default_value = rag::assistant::DEFAULT_SPEC.name())]
    pub spec: String,
    /// Compute threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Repack the model's weights on every load instead of keeping them in
    /// `$RAG_MODEL_DIR/repacked` (saves about one model size of disk).
    #[arg(long)]
    pub no_weights_cache: bool,
    /// KV cache precision: f32 (exact) or f16 (half the cache memory and attention
    /// bytes per token; llama.cpp's default).
    #[arg(long, default_value = KvPrecision::default().name(), value_parser = ["f32", "f16"])]
    pub kv_cache: String,
    /// Load the LM head without the screen that lets greedy steps read a third fewer of
    /// a large Q8_0 head's bytes (saves 0.75x the head's size of memory; same answers).
    #[arg(long)]
    pub plain_lm_head: bool,
    #[command(flatten)]
    pub backend: BackendArgs,
}

impl AssistantArgs {
    /// Whether dense retrieval is on: not with `--no-dense` or `--mode bm25`.
    pub fn dense(&self) -> bool {
        !self.no_dense && self.mode != SearchMode::Bm25
    }

    /// The assistant these flags describe, dense retrieval as `dense` says. The model
    /// starts loading at once (a command asks right away).
    pub fn options(&self, dense: bool) -> Result<AssistantOptions> {
        let mut opts = AssistantOptions::new(&self.index_dir);
        opts.model = self.model.clone();
        opts.dense = dense;
        opts.threads = self.threads;
        opts.spec = specdec::Mode::parse(&self.spec).map_err(|e| anyhow::anyhow!("--spec: {e}"))?;
        opts.kv_precision = rag_cli::kv_precision(&self.kv_cache)?;
        opts.plain_lm_head = self.plain_lm_head;
        opts.backend = self.backend.choice()?;
        opts.npu_memory_mb = self.backend.npu_memory_mb;
        if let Some(kv) = self.backend.kv_capacity() {
            opts.kv_capacity = kv;
        }
        if self.no_weights_cache {
            opts.weights_cache = WeightsCache::Off;
        }
        opts.preload_model = true;
        Ok(opts)
    }

    /// Retrieval per question: BM25 when dense retrieval is off.
    pub fn ask_options(&self, dense: bool, max_tokens: usize) -> AskOptions {
        AskOptions {
            top_k: self.top_k,
            mode: if dense { self.mode } else { SearchMode::Bm25 },
            context_tokens: self.context_tokens,
            max_tokens,
            cancel: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: AssistantArgs,
    }

    #[test]
    fn defaults_are_the_librarys() {
        let a = Wrap::parse_from(["rag"]).args;
        let lib = AskOptions::default();
        let asked = a.ask_options(a.dense(), lib.max_tokens);
        assert_eq!(
            (asked.top_k, asked.mode, asked.context_tokens),
            (lib.top_k, lib.mode, lib.context_tokens)
        );
        let opts = a.options(a.dense()).unwrap();
        let lib = AssistantOptions::new(DEFAULT_INDEX_DIR);
        assert_eq!(opts.index_dir, lib.index_dir);
        assert_eq!(opts.model, lib.model);
        assert_eq!(opts.spec, lib.spec);
        assert_eq!(opts.kv_precision, lib.kv_precision);
        assert_eq!(opts.threads, lib.threads);
        assert_eq!(opts.kv_capacity, lib.kv_capacity);
        assert_eq!(opts.plain_lm_head, lib.plain_lm_head);
        assert!(opts.dense && lib.dense);
    }

    #[test]
    fn bm25_mode_or_no_dense_turns_dense_retrieval_off() {
        let a = Wrap::parse_from(["rag", "--mode", "bm25"]).args;
        assert!(!a.dense());
        assert_eq!(a.ask_options(a.dense(), 1).mode, SearchMode::Bm25);
        let a = Wrap::parse_from(["rag", "--no-dense"]).args;
        assert!(!a.dense());
        assert_eq!(a.ask_options(a.dense(), 1).mode, SearchMode::Bm25);
        let a = Wrap::parse_from(["rag", "--mode", "dense", "-k", "3"]).args;
        assert!(a.dense());
        assert_eq!(a.ask_options(true, 1).top_k, 3);
    }
}
