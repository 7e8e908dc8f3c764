//! The everyday conveniences of `rag`, through the binary: the index remembers its folders
//! (`rag index` alone re-syncs them, `rag status`, `rag rm`), defaults from
//! `$RAG_INDEX_DIR` and the config file, a question on stdin, `rag model rm`, and the exit
//! codes scripts rely on.

mod support;

use serde_json::Value;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use support::{model_available, run_ok, sample_corpus};

/// `rag` with no config file or index directory from the environment of whoever runs
/// the tests (an empty `RAG_CONFIG`).
fn rag(args: &[&str], empty_config: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rag"));
    c.args(args)
        .env("RAG_CONFIG", empty_config)
        .env_remove("RAG_INDEX_DIR")
        .stdin(Stdio::null());
    c
}

fn run(c: &mut Command) -> Output {
    c.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// A scratch directory with an empty config file and a copy of the sample corpus.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("empty.toml"), "").unwrap();
        copy_tree(&sample_corpus(), &dir.path().join("corpus"));
        Scratch { dir }
    }
    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
    fn rag(&self, args: &[&str]) -> Command {
        rag(args, &self.path("empty.toml"))
    }
    fn corpus(&self) -> PathBuf {
        self.path("corpus").canonicalize().unwrap()
    }
}

fn search_paths(o: &Output) -> Vec<String> {
    json(o)
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["path"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_index_remembers_its_folders() {
    let s = Scratch::new();
    let idx = s.path("idx");
    let idx = idx.to_str().unwrap();
    // Nothing there yet: the missing-index code, for `index` alone and `status` alike.
    for args in [
        vec!["index", "--no-dense", "--index-dir", idx],
        vec!["status", "--index-dir", idx],
        vec!["rm", "--index-dir", idx, "x"],
    ] {
        let out = run(&mut s.rag(&args));
        assert_eq!(out.status.code(), Some(3), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("no index at"), "{}", stderr(&out));
    }
    run_ok(
        s.rag(&["index", "--no-dense", "--index-dir", idx])
            .arg(s.path("corpus")),
    );
    // A folder inside a remembered one is not remembered on its own.
    run_ok(
        s.rag(&["index", "--no-dense", "--index-dir", idx])
            .arg(s.path("corpus/guide")),
    );

    let status = json(&run_ok(&mut s.rag(&[
        "status",
        "--json",
        "--index-dir",
        idx,
    ])));
    let corpus = s.corpus().to_string_lossy().into_owned();
    assert_eq!(status["folders"].as_array().unwrap().len(), 1, "{status}");
    let folder = &status["folders"][0];
    assert_eq!(folder["path"], corpus.as_str());
    assert_eq!(folder["documents"], 12);
    assert_eq!(folder["exists"], true);
    assert!(folder["synced_unix"].as_i64() >= folder["added_unix"].as_i64());
    assert_eq!(status["files"], 12);
    assert_eq!(status["skipped_files"], 0);
    assert!(status["chunks"].as_u64().unwrap() >= 12);
    assert_eq!(status["embedding_model"], Value::Null);
    assert_eq!(status["schema_version"], 1);
    let config = s.path("empty.toml");
    assert_eq!(status["config_file"], config.to_str().unwrap());
    assert!(status["updated_unix"].as_i64().unwrap() > 1_700_000_000);
    let disk = &status["disk_bytes"];
    let parts: u64 = ["store", "bm25", "dense", "other"]
        .iter()
        .map(|k| disk[k].as_u64().unwrap())
        .sum();
    assert_eq!(disk["total"].as_u64(), Some(parts));
    assert!(disk["store"].as_u64().unwrap() > 0 && disk["bm25"].as_u64().unwrap() > 0);
    let text =
        String::from_utf8(run_ok(&mut s.rag(&["status", "--index-dir", idx])).stdout).unwrap();
    assert!(
        text.contains(&format!("  {corpus}: 12 files, 0 skipped; synced 20")),
        "{text}"
    );

    // `rag index` alone picks up a new file in the remembered folder.
    std::fs::write(
        s.path("corpus/guide/otters.md"),
        "# Otters\n\nThe zanzibar otter sleeps in the boathouse.\n",
    )
    .unwrap();
    let out = run_ok(&mut s.rag(&["index", "--no-dense", "--index-dir", idx]));
    let summary = stderr(&out);
    assert!(
        summary.contains("indexed 13 files: 1 new/changed, 12 unchanged"),
        "{summary}"
    );
    let find = || {
        search_paths(&run_ok(&mut s.rag(&[
            "search",
            "--no-dense",
            "--json",
            "--index-dir",
            idx,
            "zanzibar",
        ])))
    };
    assert!(find().iter().any(|p| p.ends_with("otters.md")));

    // `rag rm FILE`: gone from the index (still on disk, which the note says).
    let out = run_ok(
        s.rag(&["rm", "--index-dir", idx])
            .arg(s.path("corpus/guide/otters.md")),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap()
            .split(' ')
            .nth(1),
        Some("1")
    );
    assert!(stderr(&out).contains("comes back"), "{}", stderr(&out));
    assert!(find().iter().all(|p| !p.ends_with("otters.md")));
    // A path with nothing indexed under it is an error.
    let out = run(s
        .rag(&["rm", "--index-dir", idx])
        .arg(s.path("corpus/nothing-here")));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));

    // `rag rm FOLDER`: every file and the folder itself are forgotten.
    let out = run_ok(s.rag(&["rm", "--index-dir", idx]).arg(s.path("corpus")));
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(said.contains(&format!("forgot folder {corpus}")), "{said}");
    let status = json(&run_ok(&mut s.rag(&[
        "status",
        "--json",
        "--index-dir",
        idx,
    ])));
    assert_eq!(status["folders"].as_array().unwrap().len(), 0, "{status}");
    assert_eq!(
        (status["files"].as_u64(), status["chunks"].as_u64()),
        (Some(0), Some(0))
    );
    let out = run(&mut s.rag(&["index", "--no-dense", "--index-dir", idx]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("remembers no folders"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn environment_and_config_file_set_the_defaults() {
    let s = Scratch::new();
    let (a, b) = (s.path("a"), s.path("b"));
    // $RAG_INDEX_DIR instead of --index-dir.
    run_ok(
        s.rag(&["index", "--no-dense"])
            .arg(s.path("corpus"))
            .env("RAG_INDEX_DIR", &a),
    );
    assert!(a.join("store.sqlite").is_file());

    let config = s.path("config.toml");
    std::fs::write(
        &config,
        format!("index_dir = {:?}\ntop_k = 2\n", b.to_str().unwrap()),
    )
    .unwrap();
    let with_config = |args: &[&str]| {
        let mut c = s.rag(args);
        c.env("RAG_CONFIG", &config);
        c
    };
    let query = ["search", "--no-dense", "--json", "Kestrel"];
    // The config's index (not built yet) is where search looks.
    let out = run(&mut with_config(&query));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(b.to_str().unwrap()),
        "{}",
        stderr(&out)
    );
    run_ok(with_config(&["index", "--no-dense"]).arg(s.path("corpus")));
    assert!(b.join("store.sqlite").is_file());
    // top_k from the config; the flag beats it.
    assert_eq!(search_paths(&run_ok(&mut with_config(&query))).len(), 2);
    let mut flagged = with_config(&query);
    flagged.args(["-k", "3"]);
    assert_eq!(search_paths(&run_ok(&mut flagged)).len(), 3);
    // $RAG_INDEX_DIR beats the config, --index-dir beats both.
    let dir_of = |c: &mut Command| {
        let out = run_ok(c);
        json(&out)["index_dir"].as_str().unwrap().to_owned()
    };
    let canon = |p: &Path| p.canonicalize().unwrap().to_string_lossy().into_owned();
    assert_eq!(dir_of(&mut with_config(&["status", "--json"])), canon(&b));
    assert_eq!(
        dir_of(with_config(&["status", "--json"]).env("RAG_INDEX_DIR", &a)),
        canon(&a)
    );
    assert_eq!(
        dir_of(
            with_config(&["status", "--json", "--index-dir"])
                .arg(&b)
                .env("RAG_INDEX_DIR", &a)
        ),
        canon(&b)
    );

    // The user's config dir ($XDG_CONFIG_HOME/rag/config.toml) when $RAG_CONFIG is unset.
    let xdg = s.path("xdg");
    std::fs::create_dir_all(xdg.join("rag")).unwrap();
    std::fs::write(xdg.join("rag/config.toml"), "top_k = 1\n").unwrap();
    let mut c = s.rag(&query);
    c.env_remove("RAG_CONFIG")
        .env("XDG_CONFIG_HOME", &xdg)
        .env("RAG_INDEX_DIR", &a);
    assert_eq!(search_paths(&run_ok(&mut c)).len(), 1);

    // A malformed file is an error naming the file and the line; so is a missing $RAG_CONFIG.
    std::fs::write(&config, "top_k = 2\nthreads = \"many\"\n").unwrap();
    let out = run(&mut with_config(&query));
    assert_eq!(out.status.code(), Some(1));
    let want = format!("config file {}, line 2: ", config.display());
    assert!(stderr(&out).contains(&want), "{}", stderr(&out));
    std::fs::remove_file(&config).unwrap();
    let out = run(&mut with_config(&query));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(config.to_str().unwrap()),
        "{}",
        stderr(&out)
    );
}

#[test]
fn help_lists_the_new_commands_and_the_exit_codes() {
    let s = Scratch::new();
    let help = String::from_utf8(run_ok(&mut s.rag(&["--help"])).stdout).unwrap();
    for cmd in ["status", "rm"] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(cmd)),
            "{cmd} missing from:\n{help}"
        );
    }
    for code in ["2 usage", "3 no index", "4 model missing", "130 cancelled"] {
        assert!(help.contains(code), "{code} missing from:\n{help}");
    }
    // clap's usage errors are 2.
    assert_eq!(
        run(&mut s.rag(&["ask", "--top-k", "many", "q"]))
            .status
            .code(),
        Some(2)
    );
    assert_eq!(run(&mut s.rag(&["frobnicate"])).status.code(), Some(2));
    let out = run(&mut s.rag(&["ask", "--spec", "warp", "q"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("sdnpu"), "{}", stderr(&out));
}

#[test]
fn model_rm_deletes_the_model_and_its_repacked_weights() {
    let s = Scratch::new();
    let cache = s.path("models");
    let entry = rag::models::find("smollm2-135m").unwrap();
    let file = cache.join(&entry.output);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, b"not really a model").unwrap();
    let repacked = npu_runtime::weights_cache::cache_path(&cache.join("repacked"), &file);
    std::fs::create_dir_all(repacked.parent().unwrap()).unwrap();
    std::fs::write(&repacked, b"repacked").unwrap();
    let record = rag::models::verified_record(&file);
    std::fs::write(&record, b"stamp").unwrap();
    let rm = || {
        run(s
            .rag(&["model", "rm", "smollm2-135m"])
            .env("RAG_MODEL_DIR", &cache))
    };
    let out = rm();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!file.exists() && !repacked.exists() && !record.exists());
    // Not downloaded (any more), or not a model at all: the missing-model code.
    assert_eq!(rm().status.code(), Some(4));
    let out = run(s
        .rag(&["model", "rm", "no-such-model"])
        .env("RAG_MODEL_DIR", &cache));
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
}

/// `rag ask` arguments over the scratch index with the small model.
fn ask_args(idx: &str) -> Vec<&str> {
    vec![
        "ask",
        "--no-dense",
        "-m",
        "smollm2-135m",
        "--threads",
        "2",
        "--index-dir",
        idx,
    ]
}

#[test]
fn questions_on_stdin_and_exit_codes_of_ask() {
    if !model_available() {
        return;
    }
    let s = Scratch::new();
    let idx = s.path("idx");
    let idx = idx.to_str().unwrap();
    let question = "How do I do a factory reset of the Kestrel K2 console?";
    // No index: 3 (before any model is looked at).
    let out = run(s.rag(&ask_args(idx)).arg(question));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    run_ok(
        s.rag(&["index", "--no-dense", "--index-dir", idx])
            .arg(s.path("corpus")),
    );
    // A model that is neither a file nor a known name: 4.
    for model in ["/nonexistent/model.gguf", "no-such-model"] {
        let mut args = ask_args(idx);
        args[3] = model;
        let out = run(s.rag(&args).arg(question));
        assert_eq!(out.status.code(), Some(4), "{model}: {}", stderr(&out));
    }
    // No question, and nothing on stdin: a usage error.
    let out = run(&mut s.rag(&ask_args(idx)));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("no question"), "{}", stderr(&out));

    // The same question as an argument, as `-` and piped: the same sources.
    let sources = |stdin: Option<&str>, arg: Option<&str>| {
        let mut c = s.rag(&ask_args(idx));
        c.args(["--max-tokens", "1", "--json"]);
        c.args(arg);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
        drop(pipe);
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        json(&out)["sources"].clone()
    };
    let want = sources(None, Some(question));
    assert!(!want.as_array().unwrap().is_empty());
    assert_eq!(sources(Some(&format!("{question}\n")), Some("-")), want);
    assert_eq!(sources(Some(question), None), want);
    assert_ne!(
        sources(Some("What does the privacy policy say?"), None),
        want
    );
}

/// Ctrl-C (SIGINT) during an answer stops it and exits with 130.
#[test]
fn ctrl_c_cancels_an_answer_with_130() {
    if !model_available() {
        return;
    }
    let s = Scratch::new();
    let idx = s.path("idx");
    let idx = idx.to_str().unwrap();
    run_ok(
        s.rag(&["index", "--no-dense", "--index-dir", idx])
            .arg(s.path("corpus")),
    );
    let mut c = s.rag(&ask_args(idx));
    c.args(["--max-tokens", "4000", "--spec", "none"])
        .arg("Repeat the word warranty a thousand times, one per line.")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    // The first piece of the answer: generation (and the Ctrl-C handler) is running.
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(stderr(&out).contains("(cancelled)"), "{}", stderr(&out));
    assert!(!String::from_utf8_lossy(&rest).contains("Sources:"));
}
