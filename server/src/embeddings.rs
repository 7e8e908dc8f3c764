//! `POST /v1/embeddings`: vectors from the index's own embedder (the ones retrieval
//! compares), L2-normalized, as floats or base64 little-endian f32s.

use crate::error::{ApiError, ApiJson};
use crate::openai::{EmbeddingInput, EmbeddingsRequest};
use crate::AppState;
use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use serde_json::{json, Value};
use std::sync::Arc;

/// Inputs per request (OpenAI allows 2048; the CPU encoder is slower than their service).
const MAX_INPUTS: usize = 256;

pub(crate) async fn create(
    State(app): State<Arc<AppState>>,
    ApiJson(req): ApiJson<EmbeddingsRequest>,
) -> Result<Json<Value>, ApiError> {
    let (Some(embedder), Some(id)) = (app.assistant.index().embedder(), &app.embedder_id) else {
        return Err(ApiError {
            message: "this server has no embedder (it was started with --no-dense)".into(),
            ..ApiError::model_not_found(&req.model, &app.model_ids())
        });
    };
    if &req.model != id {
        return Err(ApiError::model_not_found(&req.model, &app.model_ids()));
    }
    let texts = match req.input {
        EmbeddingInput::One(s) => vec![s],
        EmbeddingInput::Many(v) => v,
        EmbeddingInput::Tokens(_) => {
            return Err(ApiError::bad_request(
                "input",
                "input must be a string or an array of strings (token ids are not accepted)",
            ))
        }
    };
    if texts.is_empty() || texts.len() > MAX_INPUTS {
        return Err(ApiError::bad_request(
            "input",
            format!("input must hold 1 to {MAX_INPUTS} strings"),
        ));
    }
    if texts.iter().any(|t| t.is_empty()) {
        return Err(ApiError::bad_request(
            "input",
            "input strings must not be empty",
        ));
    }
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_request(
                "encoding_format",
                format!("encoding_format `{other}`: expected float or base64"),
            ))
        }
    };
    let dim = embedder.dim();
    if req.dimensions.is_some_and(|d| d != dim as u64) {
        return Err(ApiError::bad_request(
            "dimensions",
            format!("this embedder gives {dim} dimensions only"),
        ));
    }
    let _ticket = app
        .lookups
        .enter()
        .await
        .map_err(|_| ApiError::queue_full("embedding"))?;
    let embedder = Arc::clone(embedder);
    let (vectors, tokens) = tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        // Usage as the encoder reads them: text tokens up to its window, plus [CLS]/[SEP].
        let tokens: usize = match embedder.chunk_tokenizer() {
            Some(t) => refs
                .iter()
                .map(|s| (t.count)(s).min(t.max_text_tokens) + 2)
                .sum(),
            None => 0,
        };
        embedder.embed_batch(&refs).map(|v| (v, tokens))
    })
    .await
    .map_err(|e| ApiError::internal(format!("embedding task failed: {e}")))?
    .map_err(|e| ApiError::internal(format!("embedding failed: {e:#}")))?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })))
}
