//! `rag chat` as a user drives it through a pipe: follow-up questions, `/sources`,
//! `/reset`, and Ctrl-C (SIGINT) stopping an answer without ending the conversation.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use support::{index_sample, model_available};

fn chat(idx: &Path, max_tokens: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rag"));
    c.args([
        "chat",
        "--no-dense",
        "--model",
        "smollm2-135m",
        "--threads",
        "2",
    ])
    .args(["--max-tokens", max_tokens, "--index-dir"])
    .arg(idx);
    c
}

#[test]
fn sources_reset_and_follow_ups_through_a_pipe() {
    if !model_available() {
        return;
    }
    let idx = tempfile::tempdir().unwrap();
    index_sample(idx.path());
    let mut child = chat(idx.path(), "16")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(
            b"/sources\nHow do I do a factory reset of the Kestrel K2 console?\n/sources\n\
              What does it erase?\n/reset\n/sources\n/nope\n",
        )
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "(no answer yet)", "{text}");
    let sources: Vec<&&str> = lines.iter().filter(|l| l.starts_with('[')).collect();
    assert!(
        sources.iter().any(|l| l.contains("troubleshooting.md:")),
        "{text}"
    );
    assert!(sources[0].starts_with("[1] "), "{text}");
    assert!(
        text.contains("(conversation cleared)\n(no answer yet)\n"),
        "{text}"
    );
    assert!(text.contains("unknown command /nope"), "{text}");
    // Two answers were written (one line or more each) between the commands.
    let answers = text.split("(conversation cleared)").next().unwrap();
    assert!(answers.lines().count() >= 2 + sources.len() + 2, "{text}");
}

#[test]
fn ctrl_c_stops_the_answer_not_the_conversation() {
    if !model_available() {
        return;
    }
    let idx = tempfile::tempdir().unwrap();
    index_sample(idx.path());
    let mut child = chat(idx.path(), "2000")
        .arg("--no-retrieval")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A broken Ctrl-C would leave the chat waiting for input: end it after a while.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (pid, finished) = (child.id().to_string(), std::sync::Arc::clone(&done));
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(180));
        if !finished.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
    });
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"Write a long story about a heron who lives by a lake.\n")
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(!first.trim().is_empty());
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "no (stopped) line"
        );
        if line.trim() == "(stopped)" {
            break;
        }
    }
    // Still there: it answers the next request and ends on EOF.
    stdin.write_all(b"/sources\n").unwrap();
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert_eq!(rest, "(no answer yet)\n");
    assert!(child.wait().unwrap().success());
    done.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// `--samples` in a conversation: the first answer is `rag ask`'s with the same samples and
/// seed (one batched decode, one kept), and the kept answer's tally goes to stderr.
#[test]
fn samples_keep_the_same_answer_as_ask() {
    if !model_available() {
        return;
    }
    let idx = tempfile::tempdir().unwrap();
    index_sample(idx.path());
    let q = "How do I do a factory reset of the Kestrel K2 console?";
    let flags = ["--samples", "3", "--seed", "7"];
    let mut child = chat(idx.path(), "12")
        .args(flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{q}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("(3 samples, kept by vote: "), "{err}");
    let chatted = String::from_utf8(out.stdout).unwrap();

    let asked = Command::new(env!("CARGO_BIN_EXE_rag"))
        .args([
            "ask",
            "--no-dense",
            "--model",
            "smollm2-135m",
            "--threads",
            "2",
        ])
        .args(["--max-tokens", "12", "--json"])
        .args(flags)
        .arg("--index-dir")
        .arg(idx.path())
        .arg(q)
        .output()
        .unwrap();
    assert!(asked.status.success());
    let v: serde_json::Value = serde_json::from_slice(&asked.stdout).unwrap();
    assert_eq!(v["candidates"].as_array().unwrap().len(), 3);
    assert_eq!(chatted.trim(), v["answer"].as_str().unwrap());
}
