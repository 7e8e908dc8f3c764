//! Builds `examples/ask.c` with the system C compiler against the shared library and runs
//! it on the sample corpus with SmolLM2-135M; its answer, hits and sources must equal what
//! `rag::Assistant` gives for the same index, question and options.

use rag::assistant::{AskOptions, Assistant, AssistantOptions};
use std::path::{Path, PathBuf};
use std::process::Command;

const QUESTION: &str = "How long is the warranty of the Kestrel K2?";
const MODEL: &str = "smollm2-135m";

/// target/<profile>, where cargo puts librag_capi.so (this test runs from its deps/).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn build_example(out: &Path) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = lib_dir();
    assert!(
        lib.join("librag_capi.so").is_file(),
        "no librag_capi.so in {}",
        lib.display()
    );
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".into());
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("examples/ask.c"))
        .arg(format!("-L{}", lib.display()))
        .arg("-lrag_capi")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(out)
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(status.success(), "{cc} failed to build examples/ask.c");
}

/// The text between two marker lines of the example's output.
fn between<'a>(out: &'a str, start: &str, end: &str) -> &'a str {
    let a = out.find(start).expect("start marker") + start.len();
    let b = out[a..].find(end).expect("end marker") + a;
    &out[a..b]
}

fn location(path: &str, lines: Option<(u32, u32)>, page: Option<u32>) -> String {
    match (lines, page) {
        (_, Some(p)) => format!("{path}#{p}"),
        (Some((a, b)), None) => format!("{path}:{a}-{b}"),
        (None, None) => path.to_owned(),
    }
}

#[test]
fn c_example_answers_like_the_rust_api() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("ask");
    build_example(&exe);
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/sample-corpus");
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
    build_example(&exe);
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
