//! `GET /v1/models` and `GET /v1/models/{id}`: the chat model, its `:no-retrieval`
//! variant and the embedder.

use crate::error::ApiError;
use crate::AppState;
use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

fn entry(app: &AppState, id: &str) -> Value {
    json!({"id": id, "object": "model", "created": app.created, "owned_by": "rag"})
}

pub(crate) async fn list(State(app): State<Arc<AppState>>) -> Json<Value> {
    let data: Vec<Value> = app.model_ids().iter().map(|id| entry(&app, id)).collect();
    Json(json!({"object": "list", "data": data}))
}

pub(crate) async fn retrieve(
    State(app): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let ids = app.model_ids();
    if ids.contains(&id) {
        Ok(Json(entry(&app, &id)))
    } else {
        Err(ApiError::model_not_found(&id, &ids))
    }
}
