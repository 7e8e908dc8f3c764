//! `rag ask "QUESTION"`: retrieve, prompt, stream the answer, cite the sources.

use anyhow::{Context, Result};
use npu_runtime::weights_cache::WeightsCache;
use rag::assistant::{AskOptions, Assistant, AssistantOptions};
use rag::{IndexOptions, SearchMode};
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    pub question: String,
    #[arg(long, default_value = ".rag-index")]
    pub index_dir: PathBuf,
    /// Index (incrementally) these folders before answering.
    #[arg(long)]
    pub corpus: Vec<PathBuf>,
    /// Model name (fetched on first use) or path to a GGUF file.
    #[arg(long, default_value = rag::models::DEFAULT_MODEL)]
    pub model: String,
    #[arg(long, short = 'k', default_value_t = 4)]
    pub top_k: usize,
    /// hybrid (BM25 + dense, fused), bm25 or dense.
    #[arg(long, default_value = "hybrid")]
    pub mode: SearchMode,
    /// BM25 only: do not load the embedding model.
    #[arg(long)]
    pub no_dense: bool,
    /// Token budget for the numbered sources in the prompt.
    #[arg(long, default_value_t = 1024)]
    pub context_tokens: usize,
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Speculative decoding: none, pld, sam or sdnpu (the answer is the same; speed differs).
    #[arg(long, default_value = "sdnpu")]
    pub spec: String,
    /// Compute threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Print one JSON object (answer, sources, timings) instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Repack the model's weights on every load instead of keeping them in
    /// `$RAG_MODEL_DIR/repacked` (saves about one model size of disk).
    #[arg(long)]
    pub no_weights_cache: bool,
    /// KV cache precision: f32 (exact) or f16 (half the cache memory and attention
    /// bytes per token; llama.cpp's default).
    #[arg(long, default_value = "f32", value_parser = ["f32", "f16"])]
    pub kv_cache: String,
    /// Load the LM head without the screen that lets greedy steps read a third fewer of
    /// a large Q8_0 head's bytes (saves 0.75x the head's size of memory; same answers).
    #[arg(long)]
    pub plain_lm_head: bool,
    #[command(flatten)]
    pub backend: rag_cli::backend_args::BackendArgs,
}

pub fn run(a: Args) -> Result<()> {
    let spec = specdec::Mode::parse(&a.spec).map_err(|e| anyhow::anyhow!("--spec: {e}"))?;
    let dense = !a.no_dense && a.mode != SearchMode::Bm25;
    let mut opts = AssistantOptions::new(&a.index_dir);
    opts.model = a.model.clone();
    opts.dense = dense;
    opts.threads = a.threads;
    opts.spec = spec;
    opts.kv_precision = rag_cli::kv_precision(&a.kv_cache)?;
    opts.plain_lm_head = a.plain_lm_head;
    opts.backend = a.backend.choice()?;
    if let Some(kv) = a.backend.kv_capacity() {
        opts.kv_capacity = kv;
    }
    if a.no_weights_cache {
        opts.weights_cache = WeightsCache::Off;
    }
    // The model load (the largest part of time to first token) overlaps the embedder load,
    // index opening and retrieval.
    opts.preload_model = true;
    let assistant = Assistant::open(opts)?;
    if !a.corpus.is_empty() {
        let bar = rag_cli::index_progress::progress_bar();
        let on_progress = |p: rag::IndexProgress| rag_cli::index_progress::update_bar(&bar, &p);
        let summary = assistant.add_paths(&a.corpus, &IndexOptions::default(), &on_progress)?;
        bar.finish_and_clear();
        eprintln!(
            "{}",
            rag_cli::index_progress::summary_line(&summary, &a.index_dir)
        );
    } else {
        anyhow::ensure!(
            a.index_dir.join("store.sqlite").is_file(),
            "no index at {}: run `rag index DIR` first (or pass --corpus DIR)",
            a.index_dir.display()
        );
    }
    let ask = AskOptions {
        top_k: a.top_k,
        mode: if dense { a.mode } else { SearchMode::Bm25 },
        context_tokens: a.context_tokens,
        max_tokens: a.max_tokens,
        cancel: None,
    };
    let stdout = std::io::stdout();
    let json = a.json;
    let mut on_text = |piece: &str| {
        if json {
            return true;
        }
        let mut out = stdout.lock();
        // A closed pipe (e.g. `| head`) just stops the answer.
        out.write_all(piece.as_bytes())
            .and_then(|_| out.flush())
            .is_ok()
    };
    let answer = assistant
        .ask(&a.question, &ask, &mut on_text)
        .context("answering")?;
    // A first run repacked the model: let the cache write finish so the next run maps it.
    assistant.finish_background_work(|what| eprintln!("({what})"));
    if json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(());
    }
    let mut out = stdout.lock();
    writeln!(out)?;
    if !answer.sources.is_empty() {
        writeln!(out, "\nSources:")?;
        for s in &answer.sources {
            writeln!(out, "[{}] {}", s.number, s.location())?;
        }
    }
    eprintln!(
        "({} tokens on {}, retrieve {:.0} ms, prefill {:.0} ms, first token {:.0} ms, decode {:.1} tok/s, {} mean accepted {:.2})",
        answer.tokens_generated,
        a.backend.backend,
        answer.timings.retrieve_ms,
        answer.timings.prefill_ms,
        answer.timings.first_token_ms,
        answer.timings.decode_tok_s,
        answer.speculation.mode,
        answer.speculation.mean_accepted
    );
    Ok(())
}
