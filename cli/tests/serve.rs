//! `rag serve` as a user starts it: the binding rules checked before anything loads. The
//! HTTP API itself is tested in `server/tests/http.rs` and by `scripts/test-server.sh`.

use std::process::Command;

#[test]
fn a_non_loopback_address_needs_an_api_key() {
    let idx = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rag"))
        .args(["serve", "--host", "0.0.0.0", "--port", "0", "--index-dir"])
        .arg(idx.path())
        .env_remove("RAG_API_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--api-key"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_rag"))
        .args(["serve", "--api-key", " ", "--port", "0", "--index-dir"])
        .arg(idx.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("must not be empty"));
}
