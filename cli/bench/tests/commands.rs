//! `rag-bench` as a developer runs it: the benchmarks are its subcommands, results go to
//! stdout and into a Markdown file only when `--report FILE` names one (never into the
//! current directory by default), and a missing data file is an error naming its flag.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn bench(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rag-bench"))
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Whether SmolLM2 is here; its absence fails the test unless model tests are skipped.
fn smollm2_or_skip() -> bool {
    if rag::models::resolve("smollm2-135m").is_ok() {
        return true;
    }
    assert!(
        std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1"),
        "smollm2-135m is missing: run scripts/fetch-model.sh smollm2-135m"
    );
    false
}

#[test]
fn help_lists_every_benchmark() {
    let dir = tempfile::tempdir().unwrap();
    let help = ok(bench(dir.path(), &["--help"]));
    for cmd in [
        "model",
        "vs-llamacpp",
        "specdec",
        "prefill",
        "retrieval",
        "answers",
        "conversations",
        "e2e",
    ] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(cmd)),
            "{cmd} missing from:\n{help}"
        );
    }
}

#[test]
fn prefill_writes_a_report_only_where_told() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["prefill", "--backend", "sim", "--prompt-tokens", "512"];
    let table = ok(bench(dir.path(), &args));
    assert!(table.contains("progressive"), "{table}");
    assert!(
        files_in(dir.path()).is_empty(),
        "{:?}",
        files_in(dir.path())
    );

    let json: Value =
        serde_json::from_str(&ok(bench(dir.path(), &[&args[..], &["--json"]].concat()))).unwrap();
    assert_eq!(json["prompt_tokens"], 512);
    assert!(json["schedules"]["optimal"]["ttft_ms"].as_f64().unwrap() > 0.0);

    let report = dir.path().join("reports/prefill.md");
    std::fs::create_dir_all(report.parent().unwrap()).unwrap();
    std::fs::write(&report, "# Mine\n\nkept\n").unwrap();
    ok(bench(
        dir.path(),
        &[&args[..], &["--report", report.to_str().unwrap()]].concat(),
    ));
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(text.starts_with("# Mine\n\nkept"), "{text}");
    assert!(
        text.contains("Command: `rag-bench prefill --backend sim --prompt-tokens 512 --report "),
        "{text}"
    );
    assert_eq!(files_in(dir.path()), ["reports"]);
}

#[test]
fn a_missing_data_file_names_its_flag() {
    // The defaults are relative to the current directory: an empty one has none of them.
    let dir = tempfile::tempdir().unwrap();
    for (args, flag) in [
        (
            &["answers"][..],
            "--corpus examples/sample-corpus: not found",
        ),
        (
            &["retrieval", "--corpus", "."][..],
            "--questions bench/retrieval/questions.jsonl: not found",
        ),
        (
            &["conversations", "--corpus", "."][..],
            "--conversations bench/conversations/two_turn.jsonl: not found",
        ),
        (
            &["specdec", "--model", "smollm2-135m"][..],
            "--dataset ../shared/data/spec_bench/question.jsonl: not found",
        ),
    ] {
        let out = bench(dir.path(), args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(flag),
            "{args:?}: {err}"
        );
    }
    assert!(files_in(dir.path()).is_empty());
}

#[test]
fn model_json_has_the_documented_fields() {
    if !smollm2_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "model",
        "--model",
        "smollm2-135m",
        "--reps",
        "1",
        "--decode-tokens",
        "4",
        "--threads",
        "2",
        "--json",
    ];
    let out = ok(bench(dir.path(), &args));
    let line = out.lines().rev().find(|l| l.starts_with('{')).unwrap();
    let v: Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["model"], "smollm2-135m.gguf");
    assert_eq!(v["threads"], 2);
    for (field, keys) in [
        ("prefill_tok_s", &["128", "512"][..]),
        ("decode_tok_s", &["0", "1000"][..]),
        ("verify_ms", &["1", "64"][..]),
    ] {
        for k in keys {
            assert!(v[field][k].as_f64().unwrap() > 0.0, "{field}.{k}: {v}");
        }
    }
    assert!(v["peak_rss_mb"].as_f64().unwrap() > 0.0);
    assert!(v["isa"].is_string());
    assert!(
        files_in(dir.path()).is_empty(),
        "{:?}",
        files_in(dir.path())
    );
}

#[test]
fn e2e_refuses_a_peer_that_tokenizes_the_prompt_differently() {
    for model in ["smollm2-135m", rag::models::DEFAULT_EMBEDDER] {
        if rag::models::resolve(model).is_err() {
            assert!(
                std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1"),
                "{model} is missing: run scripts/fetch-model.sh {model}"
            );
            return;
        }
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    let peer = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/byte_tokenizer_peer.py");
    let corpus = repo.join("examples/sample-corpus");
    let questions = repo.join("bench/answers/questions.jsonl");
    let args = [
        "e2e",
        "--python",
        "python3",
        "--peer-script",
        peer.to_str().unwrap(),
        "--model",
        "smollm2-135m",
        "--corpus",
        corpus.to_str().unwrap(),
        "--questions",
        questions.to_str().unwrap(),
    ];
    let out = bench(dir.path(), &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "compared anyway: {err}");
    assert!(
        err.contains("tokenize the prompt differently at token 0"),
        "{err}"
    );
    assert!(!err.contains("went past"), "{err}");
}

#[test]
fn specdec_ab_fixed_costs_runs_both_controllers_and_both_are_lossless() {
    if !smollm2_or_skip() {
        return;
    }
    let data =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/ui/droidtask_ui.jsonl");
    assert!(
        data.exists(),
        "{} is missing (../shared beside the repository)",
        data.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let curve = dir.path().join("curve.json");
    std::fs::write(
        &curve,
        r#"{"sizes":[1,2,4,8,16],"ms":[10.0,10.0,10.0,10.5,18.0]}"#,
    )
    .unwrap();
    let args = [
        "specdec",
        "--model",
        "smollm2-135m",
        "--category",
        "ui",
        "--dataset",
        data.to_str().unwrap(),
        "--limit",
        "2",
        "--max-tokens",
        "24",
        "--modes",
        "none,sdnpu",
        "--ab-fixed-costs",
        "--cost-curve",
        curve.to_str().unwrap(),
        "--threads",
        "1",
        "--json",
    ];
    let json: Value = serde_json::from_str(&ok(bench(dir.path(), &args))).unwrap();
    let modes = json["modes"].as_object().unwrap();
    let mut names: Vec<&str> = modes.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["none", "sdnpu", "sdnpu-fixed"]);
    for (name, m) in modes {
        assert_eq!(m["mismatches"], 0, "{name}");
        assert!(m["tokens"].as_u64().unwrap() > 0, "{name}");
    }
    let costs = |name: &str| -> Vec<(u64, f64)> {
        modes[name]["live_cost_ms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()))
            .collect()
    };
    let profiled = vec![(1, 10.0), (2, 10.0), (4, 10.0), (8, 10.5), (16, 18.0)];
    // The twin chose on the curve as given; the live controller on what it timed.
    assert_eq!(costs("sdnpu-fixed"), profiled);
    assert_ne!(costs("sdnpu"), profiled);
}
