//! `rag serve`: the OpenAI-compatible HTTP server (crate `rag-server`) over the index.

use anyhow::{Context, Result};
use npu_runtime::weights_cache::WeightsCache;
use rag::assistant::{Assistant, AssistantOptions};
use rag::{IndexOptions, SearchMode};
use rag_server::ServerOptions;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    /// Address to listen on. Anything but a loopback address needs --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every API request (default: $RAG_API_KEY,
    /// which keeps the key out of the process list).
    #[arg(long)]
    pub api_key: Option<String>,
    #[arg(long, default_value = ".rag-index")]
    pub index_dir: PathBuf,
    /// Index (incrementally) these folders before serving.
    #[arg(long)]
    pub corpus: Vec<PathBuf>,
    /// Model name (fetched on first use) or path to a GGUF file.
    #[arg(long, default_value = rag::models::DEFAULT_MODEL)]
    pub model: String,
    /// Passages retrieved into each chat prompt.
    #[arg(long, short = 'k', default_value_t = 4)]
    pub top_k: usize,
    /// Retrieval for chat: hybrid (BM25 + dense, fused), bm25 or dense.
    #[arg(long, default_value = "hybrid")]
    pub mode: SearchMode,
    /// BM25 only: do not load the embedding model (no /v1/embeddings).
    #[arg(long)]
    pub no_dense: bool,
    /// Token budget for the numbered sources in the prompt.
    #[arg(long, default_value_t = 1024)]
    pub context_tokens: usize,
    /// Largest `max_tokens` a request may ask for.
    #[arg(long, default_value_t = 2048)]
    pub max_tokens_limit: usize,
    /// `max_tokens` of requests that name none (capped by --max-tokens-limit).
    #[arg(long, default_value_t = 512)]
    pub default_max_tokens: usize,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// Chat requests that may wait while one generates (more get HTTP 429).
    #[arg(long, default_value_t = 16)]
    pub queue: usize,
    /// Speculative decoding: none, pld, sam or sdnpu (the answer is the same; speed differs).
    #[arg(long, default_value = "sdnpu")]
    pub spec: String,
    /// Compute threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// KV cache precision: f32 (exact) or f16.
    #[arg(long, default_value = "f32", value_parser = ["f32", "f16"])]
    pub kv_cache: String,
    /// Repack the model's weights on every load instead of caching them.
    #[arg(long)]
    pub no_weights_cache: bool,
}

pub fn run(mut a: Args) -> Result<()> {
    if a.api_key.is_none() {
        a.api_key = std::env::var("RAG_API_KEY").ok().filter(|k| !k.is_empty());
    }
    anyhow::ensure!(
        a.host.is_loopback() || a.api_key.is_some(),
        "--host {} makes the server reachable from other machines: set --api-key (or RAG_API_KEY)",
        a.host
    );
    anyhow::ensure!(
        a.api_key.as_deref().is_none_or(|k| !k.trim().is_empty()),
        "--api-key must not be empty"
    );
    let spec = specdec::Mode::parse(&a.spec).map_err(|e| anyhow::anyhow!("--spec: {e}"))?;
    let dense = !a.no_dense && a.mode != SearchMode::Bm25;
    let mut opts = AssistantOptions::new(&a.index_dir);
    opts.model = a.model.clone();
    opts.dense = dense;
    opts.threads = a.threads;
    opts.spec = spec;
    opts.kv_precision = rag_cli::kv_precision(&a.kv_cache)?;
    opts.preload_model = true;
    if a.no_weights_cache {
        opts.weights_cache = WeightsCache::Off;
    }
    let assistant = Assistant::open(opts)?;
    if !a.corpus.is_empty() {
        let summary = assistant.add_paths(&a.corpus, &IndexOptions::default(), &|_| {})?;
        eprintln!(
            "{}",
            rag_cli::index_progress::summary_line(&summary, &a.index_dir)
        );
    } else if !a.index_dir.join("store.sqlite").is_file() {
        eprintln!(
            "note: no index at {} yet: answers will have no sources (`rag index DIR`)",
            a.index_dir.display()
        );
    }
    assistant.load_model().context("loading the model")?;
    let assistant = Arc::new(assistant);
    let server_opts = ServerOptions {
        api_key: a.api_key,
        max_body_bytes: a.max_body_bytes,
        max_tokens_limit: a.max_tokens_limit,
        default_max_tokens: a.default_max_tokens,
        queue_waiting: a.queue,
        top_k: a.top_k,
        mode: if dense { a.mode } else { SearchMode::Bm25 },
        context_tokens: a.context_tokens,
        ..ServerOptions::default()
    };
    let router = rag_server::router(Arc::clone(&assistant), server_opts);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let addr = SocketAddr::new(a.host, a.port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let bound = listener.local_addr()?;
        eprintln!(
            "rag serve: listening on http://{bound} (model {}, OpenAI API under /v1)",
            rag_server::model_id(assistant.model_name())
        );
        let shutdown = async {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminated() => {}
            }
            eprintln!("rag serve: shutting down");
        };
        rag_server::serve(listener, router, shutdown)
            .await
            .context("serving")
    })?;
    assistant.finish_background_work(|what| eprintln!("({what})"));
    Ok(())
}

/// SIGTERM (how service managers stop a server); never on other platforms.
async fn terminated() {
    #[cfg(unix)]
    if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    {
        term.recv().await;
        return;
    }
    std::future::pending::<()>().await
}
