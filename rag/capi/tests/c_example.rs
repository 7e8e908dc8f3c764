//! Builds `examples/ask.c` with the system C compiler against the shared library and runs
//! it on the sample corpus with SmolLM2-135M; its answer, hits and sources must equal what
//! `rag::Assistant` gives for the same index, question and options.

mod c_build;

use c_build::{between, build_example, corpus, location, Link, MODEL};
use rag::assistant::{AskOptions, Assistant, AssistantOptions};
use std::process::Command;

const QUESTION: &str = "How long is the warranty of the Kestrel K2?";

#[test]
fn c_example_answers_like_the_rust_api() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("ask");
    build_example("ask", Link::Shared, &exe);
    let corpus = corpus();
    let index = dir.path().join("idx");
    let run = |extra: &[&str]| {
        let out = Command::new(&exe)
            .arg(&index)
            .arg(&corpus)
            .arg(QUESTION)
            .arg(MODEL)
            .args(extra)
            .output()
            .unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "ask failed: {stderr}\n{stdout}");
        stdout
    };
    let out = run(&["24"]);

    let mut opts = AssistantOptions::new(&index);
    opts.model = MODEL.into();
    let assistant = Assistant::open(opts).unwrap();
    let hits = assistant
        .retrieve(QUESTION, 3, rag::SearchMode::Hybrid)
        .unwrap();
    let want_hits: String = hits
        .iter()
        .enumerate()
        .map(|(i, h)| {
            format!(
                "hit {}: {} score {:.4}\n",
                i + 1,
                location(&h.path, h.lines, h.page),
                h.score
            )
        })
        .collect();
    assert_eq!(between(&out, "chunks\n", "--- answer\n"), want_hits);

    let ask = AskOptions {
        max_tokens: 24,
        ..AskOptions::default()
    };
    let answer = assistant.ask(QUESTION, &ask, &mut |_| true).unwrap();
    assert!(!answer.answer.is_empty());
    assert_eq!(
        between(&out, "--- answer\n", "\n--- sources\n").trim(),
        answer.answer
    );
    let want_sources: String = answer
        .sources
        .iter()
        .map(|s| format!("[{}] {}\n", s.number, s.location()))
        .collect();
    assert_eq!(between(&out, "--- sources\n", "tokens: "), want_sources);
    assert!(out.contains(&format!(
        "tokens: {}, cancelled: no",
        answer.tokens_generated
    )));

    // The cancel flag, set by the callback after 2 pieces, stops generation.
    let out = run(&["200", "2"]);
    let line = out.lines().find(|l| l.starts_with("tokens: ")).unwrap();
    assert!(line.contains("cancelled: yes"), "{line}");
    let tokens: usize = line["tokens: ".len()..]
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(tokens < 200, "{line}");
}

#[test]
fn c_example_reports_errors() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("ask");
    build_example("ask", Link::Shared, &exe);
    let out = Command::new(&exe)
        .arg(dir.path().join("idx"))
        .arg(dir.path().join("no-such-corpus"))
        .arg("question")
        .arg(MODEL)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("index: "), "{stderr}");
    assert!(stderr.contains("no-such-corpus"), "{stderr}");
}
