//! `POST /v1/search`: the index's ranked passages, exactly the hits `rag search --json`
//! prints (in `data`).

use crate::error::{ApiError, ApiJson};
use crate::openai::SearchRequest;
use crate::AppState;
use axum::extract::State;
use axum::Json;
use rag::SearchMode;
use serde_json::{json, Value};
use std::sync::Arc;

/// Largest `top_k` accepted.
const MAX_TOP_K: u64 = 100;

pub(crate) async fn search(
    State(app): State<Arc<AppState>>,
    ApiJson(req): ApiJson<SearchRequest>,
) -> Result<Json<Value>, ApiError> {
    if req.query.trim().is_empty() {
        return Err(ApiError::bad_request("query", "query must not be empty"));
    }
    let k = req.top_k.unwrap_or(rag::assistant::DEFAULT_TOP_K as u64);
    if k == 0 || k > MAX_TOP_K {
        return Err(ApiError::bad_request(
            "top_k",
            format!("top_k must be 1 to {MAX_TOP_K}"),
        ));
    }
    let has_embedder = app.assistant.index().embedder().is_some();
    let mode = match req.mode.as_deref() {
        None if has_embedder => SearchMode::Hybrid,
        None => SearchMode::Bm25,
        Some(m) => m
            .parse::<SearchMode>()
            .map_err(|e| ApiError::bad_request("mode", format!("{e}")))?,
    };
    if mode != SearchMode::Bm25 && !has_embedder {
        return Err(ApiError::bad_request(
            "mode",
            "this server has no embedder (started with --no-dense): only bm25",
        ));
    }
    let _ticket = app
        .lookups
        .enter()
        .await
        .map_err(|_| ApiError::queue_full("search"))?;
    let assistant = Arc::clone(&app.assistant);
    let query = req.query.clone();
    let hits = tokio::task::spawn_blocking(move || assistant.retrieve(&query, k as usize, mode))
        .await
        .map_err(|e| ApiError::internal(format!("search task failed: {e}")))?
        .map_err(|e| ApiError::internal(format!("search failed: {e:#}")))?;
    Ok(Json(json!({
        "object": "list",
        "query": req.query,
        "mode": mode.name(),
        "data": crate::printed_value(&hits),
    })))
}
