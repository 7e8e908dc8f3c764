//! `--api-key`: every API route requires `Authorization: Bearer KEY` when a key is set.

use crate::error::ApiError;
use crate::AppState;
use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;

pub(crate) async fn require_key(
    State(app): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if let Some(key) = &app.opts.api_key {
        let given = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| same_secret(g.as_bytes(), key.as_bytes())) {
            return Err(ApiError::unauthorized());
        }
    }
    Ok(next.run(req).await)
}

/// Compares without stopping at the first differing byte, so response times do not tell
/// how much of a guessed key was right.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::same_secret;

    #[test]
    fn secrets_match_only_exactly() {
        assert!(same_secret(b"k3y", b"k3y"));
        assert!(!same_secret(b"k3y", b"k3z"));
        assert!(!same_secret(b"k3", b"k3y"));
        assert!(!same_secret(b"", b"k"));
    }
}
