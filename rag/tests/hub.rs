//! Downloads from a Hub stand-in on 127.0.0.1 (no internet): file choice by quant tag and
//! by name, refusals, resume after a cut connection, hash checks, the download lock and
//! where the token goes.

mod hub_server;

use hub_server::{fake_gguf, Config, Served, Server};
use rag::models::{cached_hub_file, pull_hub_ref, Hub, HubRef};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn served(path: &str, bytes: Vec<u8>) -> Served {
    let sha = sha256(&bytes);
    Served::new(path, bytes, &sha)
}

/// A repository `o/r` with a Q4_K_M and a Q8_0 file.
fn repo(files: Vec<Served>) -> Config {
    Config {
        repo_id: "o/r".into(),
        files,
        ..Config::default()
    }
}

fn two_quants() -> Vec<Served> {
    vec![
        served("m-Q4_K_M.gguf", fake_gguf(300_000, 1)),
        served("m-Q8_0.gguf", fake_gguf(200_000, 2)),
    ]
}

fn pull(server: &Server, reference: &str, cache: &Path) -> anyhow::Result<PathBuf> {
    pull_with(&Hub::new(&server.url, None).unwrap(), reference, cache)
}

fn pull_with(hub: &Hub, reference: &str, cache: &Path) -> anyhow::Result<PathBuf> {
    pull_hub_ref(hub, &HubRef::parse(reference).unwrap(), cache, &mut |_| {})
}

#[test]
fn pull_by_quant_tag_then_resolve_offline() {
    let files = two_quants();
    let server = Server::start(repo(files.clone()));
    let cache = tempfile::tempdir().unwrap();
    let path = pull(&server, "hf.co/o/r:q4_k_m", cache.path()).unwrap();
    assert_eq!(path, cache.path().join("hf/o/r/m-Q4_K_M.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), *files[0].bytes);
    assert!(!path.with_extension("gguf.partial").exists());
    // Pulled again: listed, found verified, not downloaded again.
    assert_eq!(
        pull(&server, "hf.co/o/r:Q4_K_M", cache.path()).unwrap(),
        path
    );
    assert_eq!(server.file_requests().len(), 1);
    // Found without the server from then on.
    let r = HubRef::parse("hf.co/o/r:Q4_K_M").unwrap();
    assert_eq!(cached_hub_file(&r, cache.path()).unwrap(), path);
    let no_hub = Hub::new("http://127.0.0.1:1", None).unwrap();
    assert_eq!(
        pull_with(&no_hub, "hf.co/o/r:Q4_K_M", cache.path()).unwrap(),
        path
    );
    assert!(pull_with(&no_hub, "hf.co/o/r:Q8_0", cache.path()).is_err());
}

#[test]
fn pull_by_file_name() {
    let files = two_quants();
    let server = Server::start(repo(files.clone()));
    let cache = tempfile::tempdir().unwrap();
    let path = pull(&server, "hf.co/o/r/m-Q8_0.gguf", cache.path()).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), *files[1].bytes);
    let err = pull(&server, "hf.co/o/r/other.gguf", cache.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no file other.gguf") && err.contains("m-Q4_K_M.gguf"),
        "{err}"
    );
}

#[test]
fn a_listing_in_pages_is_read_to_the_end() {
    let mut files: Vec<Served> = (0..5)
        .map(|i| served(&format!("README-{i}.md"), vec![b'x'; 10]))
        .collect();
    files.push(served("m-Q4_K_M.gguf", fake_gguf(1000, 5)));
    let server = Server::start(Config {
        page_size: 2,
        ..repo(files.clone())
    });
    let cache = tempfile::tempdir().unwrap();
    let path = pull(&server, "hf.co/o/r:Q4_K_M", cache.path()).unwrap();
    assert_eq!(std::fs::read(path).unwrap(), *files[5].bytes);
    let listings = server.requests().len() - server.file_requests().len();
    assert_eq!(listings, 3, "{:?}", server.requests());
}

#[test]
fn an_ambiguous_or_unmatched_tag_lists_the_candidates() {
    let server = Server::start(repo(vec![
        served("a-Q4_K_M.gguf", fake_gguf(1000, 1)),
        served("b-Q4_K_M.gguf", fake_gguf(1000, 2)),
    ]));
    let cache = tempfile::tempdir().unwrap();
    let err = pull(&server, "hf.co/o/r:Q4_K_M", cache.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ambiguous") && err.contains("a-Q4_K_M.gguf") && err.contains("b-Q4_K_M.gguf"),
        "{err}"
    );
    let err = pull(&server, "hf.co/o/r:Q2_K", cache.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no GGUF file") && err.contains("a-Q4_K_M.gguf"),
        "{err}"
    );
    assert!(server.file_requests().is_empty());
}

#[test]
fn a_missing_repository_is_a_404_error() {
    let server = Server::start(repo(two_quants()));
    let cache = tempfile::tempdir().unwrap();
    let err = format!(
        "{:#}",
        pull(&server, "hf.co/o/missing:Q4_K_M", cache.path()).unwrap_err()
    );
    assert!(
        err.contains("hf.co/o/missing was not found") && err.contains("404"),
        "{err}"
    );
    assert!(
        err.contains("HF_TOKEN"),
        "says what a private repository needs: {err}"
    );
}

#[test]
fn a_cut_connection_is_resumed_with_a_range() {
    let bytes = fake_gguf(400_000, 3);
    let cut = 150_000;
    let server = Server::start(Config {
        cut_first_at: Some(cut),
        ..repo(vec![served("m-Q4_K_M.gguf", bytes.clone())])
    });
    let cache = tempfile::tempdir().unwrap();
    let path = pull(&server, "hf.co/o/r:Q4_K_M", cache.path()).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    let ranges: Vec<Option<String>> = server
        .file_requests()
        .into_iter()
        .map(|r| r.range)
        .collect();
    assert_eq!(ranges, vec![None, Some(format!("bytes={cut}-"))]);
}

#[test]
fn a_wrong_hash_is_refused_and_the_partial_file_removed() {
    let bytes = fake_gguf(100_000, 4);
    let server = Server::start(repo(vec![Served::new(
        "m-Q4_K_M.gguf",
        bytes,
        &sha256(b"something else"),
    )]));
    let cache = tempfile::tempdir().unwrap();
    let err = format!(
        "{:#}",
        pull(&server, "hf.co/o/r:Q4_K_M", cache.path()).unwrap_err()
    );
    assert!(
        err.contains("sha256 mismatch") && err.contains("removed"),
        "{err}"
    );
    let dir = cache.path().join("hf/o/r");
    assert!(!dir.join("m-Q4_K_M.gguf").exists());
    assert!(!dir.join("m-Q4_K_M.gguf.partial").exists());
}

#[test]
fn concurrent_pulls_of_one_file_download_it_once() {
    let files = two_quants();
    let server = Server::start(Config {
        body_pause: Duration::from_millis(400),
        ..repo(files.clone())
    });
    let cache = tempfile::tempdir().unwrap();
    let logs = std::sync::Mutex::new(Vec::new());
    let results: Vec<PathBuf> = std::thread::scope(|s| {
        let pulls: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let hub = Hub::new(&server.url, None).unwrap();
                    let r = HubRef::parse("hf.co/o/r:Q4_K_M").unwrap();
                    pull_hub_ref(&hub, &r, cache.path(), &mut |m| {
                        logs.lock().unwrap().push(m.to_owned())
                    })
                })
            })
            .collect();
        pulls
            .into_iter()
            .map(|p| p.join().unwrap().unwrap())
            .collect()
    });
    let logs = logs.into_inner().unwrap();
    let waited = logs
        .iter()
        .filter(|m| m.contains("another process is downloading it"));
    assert_eq!(waited.count(), 1, "one pull waited on the lock: {logs:?}");
    assert_eq!(results[0], results[1]);
    assert_eq!(std::fs::read(&results[0]).unwrap(), *files[0].bytes);
    assert_eq!(server.file_requests().len(), 1, "{:?}", server.requests());
}

#[test]
fn the_token_goes_to_the_configured_endpoint_only() {
    let files = two_quants();
    let cdn = Server::start(repo(files.clone()));
    let hub = Server::start(Config {
        redirect_to: Some(cdn.url.clone()),
        ..repo(files.clone())
    });
    let cache = tempfile::tempdir().unwrap();
    let client = Hub::new(&hub.url, Some("hf_secret".into())).unwrap();
    let path = pull_with(&client, "hf.co/o/r:Q4_K_M", cache.path()).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), *files[0].bytes);
    let hub_requests = hub.requests();
    assert_eq!(
        hub_requests.len(),
        2,
        "listing and resolve: {hub_requests:?}"
    );
    for r in &hub_requests {
        assert_eq!(
            r.authorization.as_deref(),
            Some("Bearer hf_secret"),
            "{r:?}"
        );
    }
    let cdn_requests = cdn.requests();
    assert_eq!(cdn_requests.len(), 1, "{cdn_requests:?}");
    assert!(cdn_requests[0].path.starts_with("/cdn/"));
    assert_eq!(
        cdn_requests[0].authorization, None,
        "no token after a redirect to another host"
    );
}

#[test]
fn an_unreachable_hub_says_what_to_copy_where() {
    // Nothing listens on port 1 of the loopback: refused at once.
    let hub = Hub::new("http://127.0.0.1:1", None).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let err = format!(
        "{:#}",
        pull_with(&hub, "hf.co/o/r:Q4_K_M", cache.path()).unwrap_err()
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let dir = cache.path().join("hf/o/r");
    assert!(
        err.contains("not reachable")
            && err.contains(&dir.display().to_string())
            && err.contains("Q4_K_M")
            && err.contains("HF_HUB_OFFLINE"),
        "{err}"
    );
}
