//! Parser isolation in the real binary: parsers run in worker processes that are killed on
//! timeout. A parser that loops forever, panics or aborts its process (injected through the
//! worker's test hook, `RAG_PARSE_TEST_FAULTS`) costs one skipped file with its reason, the
//! run finishes, and no worker outlives it (a looping worker left alive would), not even when
//! the indexer itself is SIGKILLed in the middle of a parse.

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

/// A parser whose allocations balloon (a decompression bomb) hits the worker's memory cap:
/// that file is skipped as crashed and the others are indexed. Without the cap the injected
/// fault (2 GiB in 64 MiB steps) would finish and the file would be indexed.
#[test]
fn a_ballooning_parser_hits_the_worker_memory_cap_and_costs_only_its_file() {
    let corpus = tempfile::tempdir().unwrap();
    std::fs::write(corpus.path().join("bomb.txt"), "RAG-TEST-FAULT:alloc\n").unwrap();
    std::fs::write(
        corpus.path().join("good.md"),
        "# Heron\n\nIt nests by the river.\n",
    )
    .unwrap();
    let idx = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rag"))
        .args(["index", "--no-dense", "--json", "--parse-timeout", "20"])
        .arg("--index-dir")
        .arg(idx.path())
        .arg(corpus.path())
        .env("RAG_PARSE_TEST_FAULTS", "1")
        .env("RAG_PARSE_WORKER_MEMORY_MB", "512")
        .env_remove("RAG_PARSE_ISOLATION")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["files_indexed"], 1, "{s}");
    assert_eq!(s["skipped_files"][0]["reason"], "crashed", "{s}");
}

/// A timeout names its flag, and raising the flag retries the file (an unchanged file
/// skipped under the same limit is not parsed again).
#[test]
fn a_timed_out_file_names_its_flag_and_is_retried_when_the_flag_grows() {
    let corpus = tempfile::tempdir().unwrap();
    std::fs::write(corpus.path().join("loop.txt"), "RAG-TEST-FAULT:loop\n").unwrap();
    let idx = tempfile::tempdir().unwrap();
    let detail = |timeout: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_rag"))
            .args(["index", "--no-dense", "--json", "--parse-timeout", timeout])
            .arg("--index-dir")
            .arg(idx.path())
            .arg(corpus.path())
            .env("RAG_PARSE_TEST_FAULTS", "1")
            .env_remove("RAG_PARSE_ISOLATION")
            .output()
            .unwrap();
        assert!(out.status.success());
        let s: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(s["skipped_files"][0]["reason"], "timeout", "{s}");
        s["skipped_files"][0]["detail"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(detail("2"), "parsing took over 2 s (--parse-timeout)");
    let t = Instant::now();
    assert_eq!(detail("2"), "parsing took over 2 s (--parse-timeout)");
    assert!(t.elapsed() < Duration::from_millis(1900), "parsed again");
    assert_eq!(detail("1"), "parsing took over 2 s (--parse-timeout)");
    assert_eq!(detail("3"), "parsing took over 3 s (--parse-timeout)");
}

fn cmdline(pid: &str) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// CPU seconds (user + system) a process has used, from /proc/PID/stat (100 ticks/s).
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let tick = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

#[test]
fn sigkill_of_the_indexer_mid_parse_takes_its_worker_down() {
    let corpus = tempfile::tempdir().unwrap();
    std::fs::write(corpus.path().join("loop.txt"), "RAG-TEST-FAULT:loop\n").unwrap();
    let idx = tempfile::tempdir().unwrap();
    let marker = format!("{}-{:?}-pdeath", std::process::id(), Instant::now());
    let mut parent = Command::new(env!("CARGO_BIN_EXE_rag"))
        .args(["index", "--no-dense", "--json", "--parse-timeout", "600"])
        .arg("--index-dir")
        .arg(idx.path())
        .arg(corpus.path())
        .env("RAG_PARSE_ISOLATION_TEST_MARKER", &marker)
        .env("RAG_PARSE_TEST_FAULTS", "1")
        .env_remove("RAG_PARSE_ISOLATION")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Mid-parse: the worker has burnt CPU on the looping file (a real parse of it takes
    // microseconds).
    let t = Instant::now();
    let worker = loop {
        let busy = processes_with(&marker).into_iter().find(|p| {
            cmdline(p).contains(corpus_tools::worker::WORKER_ARG) && cpu_seconds(p) >= 0.3
        });
        if let Some(w) = busy {
            break w;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no worker started looping"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(parent.try_wait().unwrap().is_none(), "indexer ended early");
    parent.kill().unwrap(); // SIGKILL
    parent.wait().unwrap();
    let t = Instant::now();
    while !processes_with(&marker).is_empty() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = processes_with(&marker);
    for pid in &left {
        let _ = Command::new("kill").args(["-9", pid]).status();
    }
    assert!(
        left.is_empty(),
        "worker {worker} outlived its SIGKILLed parent: {left:?}"
    );
}
