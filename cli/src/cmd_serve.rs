//! `rag serve`: the OpenAI-compatible HTTP server (crate `rag-server`) over the index.

use crate::assistant_args::AssistantArgs;
use anyhow::{Context, Result};
use rag::assistant::Assistant;
use rag::IndexOptions;
use rag_cli::config::Config;
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
    /// Index (incrementally) these folders before serving.
    #[arg(long)]
    pub corpus: Vec<PathBuf>,
    /// Largest `max_tokens` a request may ask for.
    #[arg(long, default_value_t = ServerOptions::default().max_tokens_limit)]
    pub max_tokens_limit: usize,
    /// `max_tokens` of requests that name none (capped by --max-tokens-limit).
    #[arg(long, default_value_t = ServerOptions::default().default_max_tokens)]
    pub default_max_tokens: usize,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = ServerOptions::default().max_body_bytes)]
    pub max_body_bytes: usize,
    /// Chat requests that may wait while one generates (more get HTTP 429).
    #[arg(long, default_value_t = ServerOptions::default().queue_waiting)]
    pub queue: usize,
    #[command(flatten)]
    pub assistant: AssistantArgs,
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
    let settings = a.assistant.settings(&Config::load()?)?;
    let dense = a.assistant.dense();
    let index_dir = &settings.index_dir;
    a.assistant.require_models(&settings, dense)?;
    let assistant = Assistant::open(a.assistant.options(&settings, dense)?)?;
    if !a.corpus.is_empty() {
        let summary = assistant.add_paths(&a.corpus, &IndexOptions::default(), &|_| {})?;
        eprintln!(
            "{}",
            rag_cli::index_progress::summary_line(&summary, index_dir)
        );
    } else if !index_dir.join("store.sqlite").is_file() {
        eprintln!(
            "note: no index at {} yet: answers will have no sources (`rag index DIR`)",
            index_dir.display()
        );
    }
    assistant.load_model().context("loading the model")?;
    let assistant = Arc::new(assistant);
    // Retrieval for chat; each request names its own max_tokens.
    let ask = a
        .assistant
        .ask_options(&settings, dense, a.default_max_tokens);
    let server_opts = ServerOptions {
        api_key: a.api_key,
        max_body_bytes: a.max_body_bytes,
        max_tokens_limit: a.max_tokens_limit,
        default_max_tokens: a.default_max_tokens,
        queue_waiting: a.queue,
        top_k: ask.top_k,
        mode: ask.mode,
        context_tokens: ask.context_tokens,
        default_temperature: ask.sampling.temperature,
        default_top_p: ask.sampling.top_p,
        default_seed: a.assistant.seed,
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
