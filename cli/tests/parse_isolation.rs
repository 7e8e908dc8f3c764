//! Parser isolation in the real binary: parsers run in worker processes that are killed on
//! timeout. A parser that loops forever, panics or aborts its process (injected through the
//! worker's test hook, `RAG_PARSE_TEST_FAULTS`) costs one skipped file with its reason, the
//! run finishes, and no worker outlives it (a looping worker left alive would).

use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn write_corpus(dir: &Path) {
    for i in 0..5 {
        std::fs::write(
            dir.join(format!("good{i}.md")),
            format!("# Note {i}\n\nThe heron number {i} nests by the river.\n"),
        )
        .unwrap();
    }
    for fault in ["loop", "panic", "abort"] {
        std::fs::write(
            dir.join(format!("{fault}.txt")),
            format!("RAG-TEST-FAULT:{fault}\nplain text otherwise\n"),
        )
        .unwrap();
    }
}

fn index_json(corpus: &Path, idx: &Path, marker: &str, faults: bool) -> Value {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rag"));
    c.args(["index", "--no-dense", "--json", "--parse-timeout", "3"])
        .arg("--index-dir")
        .arg(idx)
        .arg(corpus)
        .env("RAG_PARSE_ISOLATION_TEST_MARKER", marker)
        .env_remove("RAG_PARSE_ISOLATION");
    if faults {
        c.env("RAG_PARSE_TEST_FAULTS", "1");
    } else {
        c.env_remove("RAG_PARSE_TEST_FAULTS");
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "rag index failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Processes (ours: others' environ is unreadable) whose environment holds `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let needle = format!("RAG_PARSE_ISOLATION_TEST_MARKER={marker}");
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(env) = std::fs::read(e.path().join("environ")) {
            if env.split(|&b| b == 0).any(|v| v == needle.as_bytes()) {
                found.push(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    found
}

#[test]
fn looping_panicking_and_aborting_parsers_are_skipped_and_killed() {
    let corpus = tempfile::tempdir().unwrap();
    write_corpus(corpus.path());
    let idx = tempfile::tempdir().unwrap();
    let marker = format!("{}-{:?}", std::process::id(), Instant::now());
    let summary = index_json(corpus.path(), idx.path(), &marker, true);
    assert_eq!(summary["files_seen"], 8, "{summary}");
    assert_eq!(summary["files_indexed"], 5, "{summary}");
    let skipped = &summary["skipped"];
    assert_eq!(
        (&skipped["timeout"], &skipped["panic"], &skipped["crashed"]),
        (&Value::from(1), &Value::from(1), &Value::from(1)),
        "{summary}"
    );
    // Idle workers exit when the indexer's pipe closes; a looping one only if it was killed.
    let t = Instant::now();
    while !processes_with(&marker).is_empty() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        processes_with(&marker),
        Vec::<String>::new(),
        "worker left running"
    );

    // The hook is inert without its variable: the same files are plain text.
    let idx2 = tempfile::tempdir().unwrap();
    let plain = index_json(corpus.path(), idx2.path(), &marker, false);
    assert_eq!(plain["files_indexed"], 8, "{plain}");
}
