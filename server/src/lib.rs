//! `rag serve`: an OpenAI-compatible HTTP API over one [`rag::assistant::Assistant`].
//!
//! - `POST /v1/chat/completions` (streamed as server-sent events or not) answers with
//!   retrieval over the index by default and returns the cited sources in a `sources` field;
//!   the model `<id>:no-retrieval` or `"retrieval": false` answers without.
//! - `GET /v1/models`, `POST /v1/embeddings` (the index's embedder), `POST /v1/search`
//!   (the hits of `rag search --json`), `GET /health` (queue and counters; no key needed).
//!
//! The model is loaded once and shared; generations run one at a time in arrival order
//! behind a bounded queue (429 when full), each on tokio's blocking pool, and a client
//! that disconnects cancels its own generation. See docs/server.md.

mod auth;
mod chat;
mod embeddings;
pub mod error;
mod models;
pub mod openai;
pub mod queue;
mod search;

use axum::extract::{DefaultBodyLimit, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use queue::{FairQueue, QueueState};
use rag::assistant::Assistant;
use rag::SearchMode;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The model-name suffix that turns retrieval off.
pub const NO_RETRIEVAL_SUFFIX: &str = ":no-retrieval";

/// How a server behaves; the model and index are the [`Assistant`]'s.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Every endpoint but `/health` requires `Authorization: Bearer KEY` when set.
    pub api_key: Option<String>,
    /// Largest request body accepted (413 above).
    pub max_body_bytes: usize,
    /// Largest `max_tokens` a request may ask for (400 above).
    pub max_tokens_limit: usize,
    /// `max_tokens` of a request that names none (capped by the limit).
    pub default_max_tokens: usize,
    /// Chat requests that may wait while one generates (429 beyond).
    pub queue_waiting: usize,
    /// Retrieval for chat: passages put in the prompt, search mode, their token budget.
    pub top_k: usize,
    pub mode: SearchMode,
    pub context_tokens: usize,
    /// Sampling of a request that names no temperature / top_p / seed (0: greedy; no
    /// seed: a fresh one per request).
    pub default_temperature: f32,
    pub default_top_p: f32,
    pub default_seed: Option<u64>,
    /// How often an idle stream sends an SSE comment (keeps proxies from timing out and
    /// finds a vanished client while the answer is still in the queue or in prefill).
    pub keep_alive: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        // Retrieval as `Assistant::ask` does it by default.
        let ask = rag::assistant::AskOptions::default();
        ServerOptions {
            api_key: None,
            max_body_bytes: 1 << 20,
            max_tokens_limit: 2048,
            default_max_tokens: 512,
            queue_waiting: 16,
            top_k: ask.top_k,
            mode: ask.mode,
            context_tokens: ask.context_tokens,
            default_temperature: ask.sampling.temperature,
            default_top_p: ask.sampling.top_p,
            default_seed: None,
            keep_alive: Duration::from_secs(2),
        }
    }
}

/// Finished generations by outcome, for `/health` (and tests).
#[derive(Debug, Default)]
struct Counters {
    completed: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    /// Tokens generated, cancelled generations included.
    tokens: AtomicU64,
}

struct AppState {
    assistant: Arc<Assistant>,
    opts: ServerOptions,
    generation: FairQueue,
    /// Embeddings and search: short, but they share the embedder.
    lookups: FairQueue,
    model_id: String,
    embedder_id: Option<String>,
    created: u64,
    counters: Counters,
    next_id: AtomicU64,
}

impl AppState {
    /// Model ids this server answers to, the chat model first.
    fn model_ids(&self) -> Vec<String> {
        let mut ids = vec![
            self.model_id.clone(),
            format!("{}{NO_RETRIEVAL_SUFFIX}", self.model_id),
        ];
        ids.extend(self.embedder_id.clone());
        ids
    }

    fn next_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.created)
    }
}

/// `v` as a JSON value with its numbers as its own `Serialize` prints them: an `f32` score
/// stays `0.14553621` (what `rag search --json` prints) instead of widening to
/// `0.14553621411323547` as `serde_json::to_value` does.
fn printed_value<T: Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_string(v)
        .and_then(|s| serde_json::from_str(&s))
        .unwrap_or(serde_json::Value::Null)
}

/// The id `/v1/models` shows for a model name or a GGUF path (its file stem).
pub fn model_id(name_or_path: &str) -> String {
    let p = std::path::Path::new(name_or_path);
    if name_or_path.ends_with(".gguf") || p.components().count() > 1 {
        if let Some(stem) = p.file_stem().and_then(|s| s.to_str()) {
            return stem.to_owned();
        }
    }
    name_or_path.to_owned()
}

/// The HTTP routes over `assistant` (which should have its model loaded already, so the
/// first request does not pay for it).
pub fn router(assistant: Arc<Assistant>, opts: ServerOptions) -> Router {
    let embedder_id = assistant
        .index()
        .embedder()
        .map(|e| e.name().unwrap_or(rag::models::DEFAULT_EMBEDDER).to_owned());
    let state = Arc::new(AppState {
        model_id: model_id(assistant.model_name()),
        embedder_id,
        generation: FairQueue::new(1, opts.queue_waiting),
        lookups: FairQueue::new(2, opts.queue_waiting.max(1) * 4),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        counters: Counters::default(),
        next_id: AtomicU64::new(0),
        assistant,
        opts,
    });
    let api = Router::new()
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/embeddings", post(embeddings::create))
        .route("/v1/search", post(search::search))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{id}", get(models::retrieve))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            auth::require_key,
        ));
    Router::new()
        .route("/health", get(health))
        .merge(api)
        .fallback(|| async { error::ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async { error::ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(state.opts.max_body_bytes))
        .with_state(state)
}

/// Serve `router` on `listener` until `shutdown` completes (then finish open requests).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

#[derive(Serialize)]
struct Health {
    status: &'static str,
    model: String,
    generation_queue: QueueState,
    lookup_queue: QueueState,
    generations: GenerationCounts,
}

#[derive(Serialize)]
struct GenerationCounts {
    completed: u64,
    cancelled: u64,
    failed: u64,
    tokens: u64,
}

async fn health(State(app): State<Arc<AppState>>) -> Json<Health> {
    let c = &app.counters;
    Json(Health {
        status: "ok",
        model: app.model_id.clone(),
        generation_queue: app.generation.state(),
        lookup_queue: app.lookups.state(),
        generations: GenerationCounts {
            completed: c.completed.load(Ordering::SeqCst),
            cancelled: c.cancelled.load(Ordering::SeqCst),
            failed: c.failed.load(Ordering::SeqCst),
            tokens: c.tokens.load(Ordering::SeqCst),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_of_names_and_paths() {
        assert_eq!(model_id("smollm2-135m"), "smollm2-135m");
        assert_eq!(model_id("/m/qwen2.5-coder-0.5b.gguf"), "qwen2.5-coder-0.5b");
        assert_eq!(model_id("my.gguf"), "my");
    }
}
