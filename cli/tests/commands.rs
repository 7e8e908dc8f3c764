//! The `rag index`, `rag search` and `rag ask` commands as a user runs them: output shapes
//! (`--json` schemas of docs/json-schemas.md), the summary on a non-terminal stderr (no
//! progress bar), citations at the end of a streamed answer, and `rag ask` answering from
//! the last committed index while `rag index` rewrites it.

mod support;

use serde_json::Value;
use std::path::Path;
use std::process::{Output, Stdio};
use support::{index_sample, model_available, rag, run_ok, sample_corpus};

#[test]
fn help_shows_only_user_commands() {
    let help = String::from_utf8(run_ok(&mut rag(&["--help"])).stdout).unwrap();
    for cmd in [
        "index", "search", "ask", "chat", "generate", "serve", "model",
    ] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(cmd)),
            "{cmd} missing from:\n{help}"
        );
    }
    // The benchmarks are `rag-bench` (cli/bench).
    assert!(!help.contains("bench"), "{help}");
    assert!(!rag(&["bench", "model"]).output().unwrap().status.success());
}

/// `rag index` chunks as the library does, so `rag ask --corpus` over the same folder finds
/// every file current instead of re-chunking (and re-embedding) all of them.
#[test]
fn ask_with_corpus_after_index_reindexes_nothing() {
    if !model_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let idx = dir.path().join("idx");
    index_sample(&idx);
    let out = run_ok(
        rag(&["ask", "What is the warranty?", "--no-dense"])
            .args(["--model", "smollm2-135m", "--max-tokens", "1"])
            .arg("--index-dir")
            .arg(&idx)
            .arg("--corpus")
            .arg(sample_corpus()),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let summary = err.lines().find(|l| l.starts_with("indexed ")).unwrap();
    assert!(
        summary.contains(": 0 new/changed, ") && !summary.contains(" 0 unchanged"),
        "{summary}"
    );
}

#[test]
fn index_summary_without_a_terminal_has_no_progress_bar() {
    let idx = tempfile::tempdir().unwrap();
    // stderr is a pipe here, not a terminal: only the summary line may appear.
    let out = index_sample(idx.path());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert!(!err.contains('\r') && !err.contains('\u{1b}'), "{err:?}");
    for field in [
        "indexed 12 files",
        "12 new/changed",
        "0 skipped",
        "chunks:",
        " s (",
        "chunks/s",
    ] {
        assert!(err.contains(field), "missing {field:?} in {err:?}");
    }
    // The JSON summary of an unchanged re-run.
    let out = run_ok(
        rag(&["index", "--no-dense", "--json", "--index-dir"])
            .arg(idx.path())
            .arg(sample_corpus()),
    );
    assert!(
        out.stderr.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["files_seen"], 12);
    assert_eq!(s["files_unchanged"], 12);
    assert_eq!(s["chunks_added"], 0);
    for key in [
        "files_indexed",
        "files_removed",
        "skipped",
        "skipped_files",
        "walk_errors",
        "chunks_removed",
        "chunks_total",
        "chunks_embedded",
        "generation",
        "elapsed",
    ] {
        assert!(s.get(key).is_some(), "missing {key} in {s}");
    }
}

/// Files as users have them, through the binary: every encoding of corpus-tools' corpus
/// found and cited at its line by `rag search`; skipped files listed by path in `--json`
/// and on the terminal (a short table, all of them with `--verbose`).
#[test]
fn index_lists_skipped_files_and_search_cites_every_encoding() {
    use corpus_tools::test_support::{binary_files, write_encoding_corpus};
    let corpus = tempfile::tempdir().unwrap();
    let d = corpus.path();
    let files = write_encoding_corpus(d).unwrap();
    for (name, bytes, _) in binary_files() {
        std::fs::write(d.join(name), bytes).unwrap();
    }
    for i in 0..10 {
        std::fs::write(d.join(format!("blob{i:02}")), [1u8, 0, 2, 0]).unwrap();
    }
    std::fs::write(d.join("huge.log"), "log line\n".repeat(200_000)).unwrap();
    let idx = tempfile::tempdir().unwrap();
    let index = |extra: &[&str]| {
        let mut c = rag(&[
            "index",
            "--no-dense",
            "--chunk-tokens",
            "24",
            "--overlap",
            "0",
        ]);
        c.args(["--max-file-mb", "1"]).args(extra);
        run_ok(c.arg("--index-dir").arg(idx.path()).arg(d))
    };
    let s: Value = serde_json::from_slice(&index(&["--json"]).stdout).unwrap();
    assert_eq!(s["files_indexed"], files.len(), "{s}");
    let skipped = s["skipped_files"].as_array().unwrap();
    assert_eq!(skipped.len(), 15, "{s}");
    let entry = |name: &str| {
        skipped
            .iter()
            .find(|f| f["path"].as_str().unwrap().ends_with(&format!("/{name}")))
            .unwrap_or_else(|| panic!("{name} not in {s}"))
    };
    assert_eq!(entry("picture")["reason"], "binary");
    assert_eq!(entry("picture")["detail"], "PNG image");
    assert_eq!(entry("blob03")["detail"], "NUL bytes");
    assert_eq!(entry("huge.log")["reason"], "too-large");
    let detail = entry("huge.log")["detail"].as_str().unwrap();
    assert!(detail.contains("--max-file-mb"), "{detail}");

    // The unchanged re-run on a terminal-less stderr: summary line, then the table.
    let err = String::from_utf8(index(&[]).stderr).unwrap();
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines[0].contains("15 skipped (binary 14, too-large 1)"),
        "{err}"
    );
    assert_eq!(lines[1], "skipped files (15):", "{err}");
    // The limit a flag moves comes first; ten rows, then a pointer to the rest.
    assert!(lines[2].trim_start().starts_with("too-large"), "{err}");
    assert_eq!(lines.len(), 2 + 10 + 1, "{err}");
    assert!(
        lines[12].contains("5 more") && lines[12].contains("--verbose"),
        "{err}"
    );
    let err = String::from_utf8(index(&["--verbose"]).stderr).unwrap();
    assert_eq!(err.lines().count(), 2 + 15, "{err}");
    assert!(err.contains("ELF executable"), "{err}");

    for f in files.iter().filter(|f| f.line.is_some()) {
        let out = run_ok(
            rag(&["search", "--no-dense", "--json", "-k", "1", "--index-dir"])
                .arg(idx.path())
                .arg(f.word),
        );
        let hits: Value = serde_json::from_slice(&out.stdout).unwrap();
        let h = &hits[0];
        let path = h["path"].as_str().unwrap_or_default();
        assert!(path.ends_with(&format!("/{}", f.name)), "{f:?}: {hits}");
        let n = f.line.unwrap() as u64;
        let (a, b) = (
            h["lines"][0].as_u64().unwrap(),
            h["lines"][1].as_u64().unwrap(),
        );
        assert!(a <= n && n <= b, "{f:?}: {hits}");
    }
}

#[test]
fn search_json_schema() {
    let idx = tempfile::tempdir().unwrap();
    index_sample(idx.path());
    let out = run_ok(
        rag(&[
            "search",
            "factory reset",
            "--no-dense",
            "--json",
            "-k",
            "3",
            "--index-dir",
        ])
        .arg(idx.path()),
    );
    let hits: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    // Only two chunks mention the terms at all (BM25, top 3 asked).
    assert_eq!(hits.len(), 2);
    let top = &hits[0];
    assert!(top["path"]
        .as_str()
        .unwrap()
        .ends_with("troubleshooting.md"));
    assert!(top["chunk_id"].is_i64());
    assert!(top["score"].is_f64());
    assert_eq!(top["lines"].as_array().unwrap().len(), 2);
    assert!(top["page"].is_null());
    assert!(top["heading"].as_str().unwrap().contains("Factory reset"));
    assert!(top["text"].as_str().unwrap().contains("PAIR"));
    assert_eq!(top["bm25_rank"], 1);
    assert!(top["dense_rank"].is_null());
    assert!(hits
        .windows(2)
        .all(|w| w[0]["score"].as_f64() >= w[1]["score"].as_f64()));
}

#[test]
fn ask_json_schema_and_streamed_citations() {
    if !model_available() {
        return;
    }
    let idx = tempfile::tempdir().unwrap();
    index_sample(idx.path());
    let ask = |json: bool| {
        let mut c = rag(&[
            "ask",
            "How do I do a factory reset of the Kestrel K2 console?",
            "--model",
            "smollm2-135m",
            "--no-dense",
            "--max-tokens",
            "12",
            "--threads",
            "2",
            "--index-dir",
        ]);
        c.arg(idx.path());
        if json {
            c.arg("--json");
        }
        run_ok(&mut c)
    };
    let out = ask(true);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // The fields issue 4 names, with their types.
    assert!(v["answer"].is_string());
    let n = v["tokens_generated"].as_u64().unwrap();
    assert!(n > 0 && n <= 12, "{v}");
    for t in ["retrieve_ms", "prefill_ms", "decode_ms", "decode_tok_s"] {
        assert!(
            v["timings"][t].as_f64().unwrap() >= 0.0,
            "timings.{t} in {v}"
        );
    }
    let sources = v["sources"].as_array().unwrap();
    assert!(!sources.is_empty());
    for s in sources {
        assert!(s["path"].is_string());
        assert!(s["chunk_id"].is_i64());
        assert!(s["score"].is_f64());
        let lines = s.get("lines").and_then(Value::as_array);
        let page = s.get("page").and_then(Value::as_u64);
        match (lines, page) {
            (Some(l), None) => assert!(l.len() == 2 && l[0].as_u64() <= l[1].as_u64()),
            (None, Some(_)) => {}
            // HTML has neither (no source lines, no pages).
            (None, None) => assert!(s["path"].as_str().unwrap().ends_with(".html"), "{s}"),
            (Some(_), Some(_)) => panic!("both lines and page: {s}"),
        }
    }
    assert!(sources
        .iter()
        .any(|s| s["path"].as_str().unwrap().ends_with("troubleshooting.md")));

    // Text mode: the answer streams, then the numbered citations close the output.
    let out = ask(false);
    let text = String::from_utf8(out.stdout).unwrap();
    let (answer, cites) = text.rsplit_once("\nSources:\n").expect("a Sources block");
    assert!(!answer.trim().is_empty());
    let cites: Vec<&str> = cites.lines().collect();
    assert_eq!(cites.len(), sources.len());
    for (i, c) in cites.iter().enumerate() {
        let (num, loc) = c.split_once(' ').unwrap();
        assert_eq!(num, format!("[{}]", i + 1));
        let path = sources[i]["path"].as_str().unwrap();
        match sources[i].get("lines").and_then(Value::as_array) {
            Some(l) => assert_eq!(loc, format!("{path}:{}-{}", l[0], l[1])),
            None => assert!(loc.starts_with(path), "{c}"),
        }
    }
}

fn write_corpus(dir: &Path, files: usize, extra: &str) {
    for i in 0..files {
        let sub = dir.join(format!("part{}", i % 5));
        std::fs::create_dir_all(&sub).unwrap();
        let mut body = format!("# Document {i}\n\n");
        for s in 0..5 {
            body += &format!("## Section {s}\n\n");
            for l in 0..10 {
                body += &format!(
                    "Line {l} of section {s} in document {i} mentions token{} {extra}.\n",
                    (i * 31 + l) % 97
                );
            }
            body.push('\n');
        }
        std::fs::write(sub.join(format!("doc{i}.md")), body).unwrap();
    }
}

#[test]
fn ask_answers_while_index_rewrites_everything() {
    if !model_available() {
        return;
    }
    let corpus = tempfile::tempdir().unwrap();
    write_corpus(corpus.path(), 400, "");
    std::fs::write(
        corpus.path().join("otters.md"),
        "# Otters\n\nThe otter daemon listens on port 7311.\n",
    )
    .unwrap();
    let idx = tempfile::tempdir().unwrap();
    let index = || {
        let mut c = rag(&["index", "--no-dense", "--commit-every", "40", "--index-dir"]);
        c.arg(idx.path())
            .arg(corpus.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    assert!(index().status().unwrap().success());
    // Every document changes: the writer re-parses and re-commits all of them.
    write_corpus(corpus.path(), 400, "and zebras");
    let mut writer = index().spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let writer_running = writer.try_wait().unwrap().is_none();
    let out = run_ok(
        rag(&[
            "ask",
            "Which port does the otter daemon listen on?",
            "--model",
            "smollm2-135m",
            "--no-dense",
            "--max-tokens",
            "6",
            "--threads",
            "1",
            "--json",
            "--index-dir",
        ])
        .arg(idx.path()),
    );
    assert!(writer.wait().unwrap().success());
    assert!(
        writer_running,
        "the writer finished before the question was asked: grow the corpus"
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["sources"][0]["path"]
        .as_str()
        .unwrap()
        .ends_with("otters.md"));
}

/// `rag generate` keeps the repacked weights in `$RAG_MODEL_DIR/repacked` after a first run
/// (and says so), maps them on the next run with the same output, and
/// `--no-weights-cache` writes nothing.
#[test]
fn generate_caches_repacked_weights_unless_told_not_to() {
    if !model_available() {
        return;
    }
    let model = rag::models::resolve("smollm2-135m").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join(model.file_name().unwrap());
    std::fs::copy(&model, &copy).unwrap();
    let generate = |extra: &[&str]| {
        let mut c = rag(&[
            "generate",
            "--prompt",
            "The capital of France is",
            "--max-tokens",
            "6",
        ]);
        c.arg("--model")
            .arg(&copy)
            .args(["--threads", "2", "--json"]);
        c.args(extra).env("RAG_MODEL_DIR", dir.path());
        run_ok(&mut c)
    };
    let cache = dir.path().join("repacked");
    let plain = generate(&["--no-weights-cache"]);
    assert!(
        !cache.exists(),
        "--no-weights-cache wrote {}",
        cache.display()
    );
    let first = generate(&[]);
    let note = String::from_utf8_lossy(&first.stderr);
    // "writing ..." while the background write runs, "wrote ..." if it finished first.
    assert!(note.contains("the repacked weights to"), "{note}");
    let files: Vec<_> = std::fs::read_dir(&cache).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "one cache file");
    let second = generate(&[]);
    assert!(!String::from_utf8_lossy(&second.stderr).contains("the repacked weights to"));
    let tokens = |o: &Output| serde_json::from_slice::<Value>(&o.stdout).unwrap()["tokens"].clone();
    assert_eq!(tokens(&plain), tokens(&first));
    assert_eq!(tokens(&plain), tokens(&second));
}

/// `rag ask --backend qnn`: retrieval, the prompt's prefill on the QNN prefill graphs and
/// speculative decoding on the 16-row verify graphs of the HTP emulator; the answer comes
/// with its sources. Small on purpose (one source, 4 tokens): emulation is slow. The graph
/// shapes match `tests/tests/qnn_speculative.rs`, so the two share compiled graphs.
/// A residency budget that holds one form of every block: the prefill switches graphs
/// progressively (reported under `switching`), and the tokens are the ones every graph
/// resident gives, with plain greedy steps and with speculative decoding; a budget below
/// one form is a clear error.
#[test]
fn a_residency_budget_switches_graphs_without_changing_the_answer() {
    if !model_available() {
        return;
    }
    let profiles = tempfile::tempdir().unwrap();
    // ~270 tokens: three prefill chunks of 128.
    let prompt = "The capital of France is Paris. The capital of Germany is Berlin. ".repeat(18);
    let generate = |extra: &[&str]| -> Value {
        let mut c = rag(&["generate", "--prompt", &prompt, "--max-tokens", "12"]);
        c.args(["--threads", "2", "--json"])
            .args(extra)
            .env("RAG_PROFILE_DIR", profiles.path());
        serde_json::from_slice(&run_ok(&mut c).stdout).unwrap()
    };
    let resident = generate(&[]);
    assert!(resident["switching"].is_null(), "{resident}");
    for spec in ["none", "sdnpu"] {
        let v = generate(&["--npu-memory-mb", "5", "--spec", spec]);
        assert_eq!(v["tokens"], resident["tokens"], "--spec {spec}: {v}");
        let sw = &v["switching"];
        assert_eq!(sw["schedule"], "progressive-ls", "{v}");
        assert_eq!(sw["switches"], 1, "one block on the CPU: {v}");
        assert!(sw["stall_ms"].as_f64().unwrap() >= 0.0, "{v}");
    }
    // A cached warm-up profile that no longer describes the layout (here: one block
    // too many) is measured again, not an error.
    for entry in std::fs::read_dir(profiles.path()).unwrap() {
        let path = entry.unwrap().path();
        let Ok(mut p) = serde_json::from_str::<Value>(&std::fs::read_to_string(&path).unwrap())
        else {
            continue;
        };
        if let Some(blocks) = p["blocks"].as_array_mut() {
            let extra = blocks[0].clone();
            blocks.push(extra);
            std::fs::write(&path, p.to_string()).unwrap();
        }
    }
    let v = generate(&["--npu-memory-mb", "5"]);
    assert_eq!(v["tokens"], resident["tokens"], "{v}");
    let mut c = rag(&["generate", "--prompt", "Hi", "--npu-memory-mb", "1"]);
    let out = c.env("RAG_PROFILE_DIR", profiles.path()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot hold one form of every block"), "{err}");

    // `rag ask` reports it in its timings.
    let idx = tempfile::tempdir().unwrap();
    index_sample(idx.path());
    let mut c = rag(&[
        "ask",
        "How do I do a factory reset of the Kestrel K2 console?",
        "--model",
        "smollm2-135m",
        "--no-dense",
        "--max-tokens",
        "4",
        "--npu-memory-mb",
        "5",
        "--json",
        "--index-dir",
    ]);
    c.arg(idx.path()).env("RAG_PROFILE_DIR", profiles.path());
    let v: Value = serde_json::from_slice(&run_ok(&mut c).stdout).unwrap();
    assert_eq!(
        v["timings"]["switching"]["schedule"], "progressive-ls",
        "{v}"
    );
}

#[test]
fn ask_on_the_qnn_backend_answers_with_sources() {
    if !model_available() {
        return;
    }
    if let Err(e) = npu_qnn::runtime() {
        if std::env::var("RAG_SKIP_QNN_TESTS").as_deref() == Ok("1") {
            return;
        }
        panic!("{e} (set RAG_SKIP_QNN_TESTS=1 to skip QNN tests)");
    }
    let idx = tempfile::tempdir().unwrap();
    index_sample(idx.path());
    let out = run_ok(
        rag(&[
            "ask",
            "How do I do a factory reset of the Kestrel K2 console?",
            "--model",
            "smollm2-135m",
            "--no-dense",
            "--top-k",
            "1",
            "--context-tokens",
            "96",
            "--max-tokens",
            "4",
            "--backend",
            "qnn",
            "--qnn-kv",
            "256",
            "--json",
            "--index-dir",
        ])
        .arg(idx.path()),
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["backend"], "qnn-htp", "{v}");
    assert!(!v["answer"].as_str().unwrap().is_empty(), "{v}");
    let n = v["tokens_generated"].as_u64().unwrap();
    assert!(n > 0 && n <= 4, "{v}");
    assert_eq!(v["sources"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["speculation"]["mode"], "sdnpu", "{v}");
}
