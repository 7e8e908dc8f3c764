//! Documents read through a command the user configured (aichat's document loaders):
//! for a file whose extension has one, `sh -c COMMAND sh PATH` runs with the file's path
//! as `$1`, and what it prints is the document's text. The path is an argument, never
//! pasted into the command text, so a hostile file name cannot inject shell code. The
//! command runs under the same limits as a parser: its output is capped, and after the
//! time limit its whole process group is killed.

use crate::detect::{detect, DocKind, Skip, SkipReason};
use crate::direct::{check_output, ParseLimits};
use crate::parse::{parse_bytes, ParsedDoc};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Stderr kept for the skip message.
const STDERR_TAIL: usize = 400;

/// Extension (lower case, no dot) to command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Loaders {
    by_ext: BTreeMap<String, String>,
}

impl Loaders {
    /// `pairs` of extension (`pdf`, `.PDF`) and command (`pdftotext $1 -`).
    pub fn new(pairs: impl IntoIterator<Item = (String, String)>) -> Result<Self, String> {
        let mut by_ext = BTreeMap::new();
        for (ext, cmd) in pairs {
            let ext = ext.trim().trim_start_matches('.').to_ascii_lowercase();
            if ext.is_empty() || ext.contains(['/', '\\']) {
                return Err(format!("loader extension `{ext}` is not a file extension"));
            }
            if cmd.trim().is_empty() {
                return Err(format!("loader for .{ext}: empty command"));
            }
            by_ext.insert(ext, cmd);
        }
        Ok(Loaders { by_ext })
    }

    pub fn is_empty(&self) -> bool {
        self.by_ext.is_empty()
    }

    /// The command for `path`, by its last extension (case-insensitive).
    pub fn for_path(&self, path: &Path) -> Option<&str> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        self.by_ext.get(&ext).map(String::as_str)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.by_ext.iter().map(|(e, c)| (e.as_str(), c.as_str()))
    }
}

/// Runs `command` on `path` and parses its output as plain text.
pub fn run(command: &str, path: &Path, limits: &ParseLimits) -> Result<ParsedDoc, Skip> {
    let fail = |detail: String| Skip::new(SkipReason::ParseError, detail);
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .arg("sh")
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .spawn()
        .map_err(|e| fail(format!("loader `{command}` could not start: {e}")))?;
    let cap = limits.max_text_bytes as u64 + 1;
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    // Readers on their own threads: a command that fills one pipe while we wait on the
    // other must not block. A reader stops at its cap; the rest is never read.
    let out = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = (&mut stdout).take(cap).read_to_end(&mut buf);
        buf
    });
    let err = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = (&mut stderr).take(64 << 10).read_to_end(&mut buf);
        buf
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if started.elapsed() < limits.timeout => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(None) => {
                kill_group(&mut child);
                return Err(Skip::new(
                    SkipReason::Timeout,
                    format!("loader `{command}` ran over {:?}", limits.timeout),
                ));
            }
            Err(e) => {
                kill_group(&mut child);
                return Err(fail(format!("loader `{command}`: {e}")));
            }
        }
    };
    // The shell has ended; a background child it left could still hold the pipes, so
    // the readers get the rest of the time limit, then the group is killed.
    let bytes = join_within(out, limits.timeout.saturating_sub(started.elapsed()));
    let Some(bytes) = bytes else {
        kill_group(&mut child);
        return Err(Skip::new(
            SkipReason::Timeout,
            format!(
                "loader `{command}` left output open past {:?}",
                limits.timeout
            ),
        ));
    };
    // Before the exit status: a command cut off at the cap dies of a broken pipe.
    if bytes.len() as u64 >= cap {
        kill_group(&mut child);
        return Err(Skip::new(
            SkipReason::TooLarge,
            format!("loader output over {} MiB", limits.max_text_bytes >> 20),
        ));
    }
    if !status.success() {
        let err = join_within(err, Duration::from_millis(200)).unwrap_or_default();
        let err = String::from_utf8_lossy(&err);
        let tail: String = {
            let t = err.trim();
            let start = t.len().saturating_sub(STDERR_TAIL);
            let start = (start..=t.len())
                .find(|&i| t.is_char_boundary(i))
                .unwrap_or(0);
            t[start..].to_string()
        };
        return Err(fail(format!(
            "loader `{command}` failed ({status}): {tail}"
        )));
    }
    // Decoded like a text file (UTF-8, UTF-16 with a BOM, legacy encodings).
    let (_, text) = detect(Path::new("loader-output.txt"), bytes)?;
    let doc = parse_bytes(DocKind::Text, &text).map_err(fail)?;
    check_output(doc, limits)
}

fn join_within(handle: std::thread::JoinHandle<Vec<u8>>, limit: Duration) -> Option<Vec<u8>> {
    let until = Instant::now() + limit;
    while !handle.is_finished() {
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    handle.join().ok()
}

/// Kills the command and everything it started (its own process group).
fn kill_group(child: &mut std::process::Child) {
    #[cfg(unix)]
    {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", child.id())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_of(doc: &ParsedDoc) -> String {
        doc.sections
            .iter()
            .flat_map(|s| &s.lines)
            .map(|l| l.text.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn limits(timeout_ms: u64) -> ParseLimits {
        ParseLimits {
            timeout: Duration::from_millis(timeout_ms),
            ..Default::default()
        }
    }

    #[test]
    fn extensions_are_normalised_and_checked() {
        let l = Loaders::new([
            (".PDF".to_string(), "pdftotext $1 -".to_string()),
            ("note".to_string(), "cat $1".to_string()),
        ])
        .unwrap();
        assert_eq!(l.for_path(Path::new("a/b.pdf")), Some("pdftotext $1 -"));
        assert_eq!(l.for_path(Path::new("B.Pdf")), Some("pdftotext $1 -"));
        assert_eq!(l.for_path(Path::new("x.note")), Some("cat $1"));
        assert_eq!(l.for_path(Path::new("x.txt")), None);
        assert_eq!(l.for_path(Path::new("noext")), None);
        assert!(Loaders::new([("".to_string(), "cat".to_string())]).is_err());
        assert!(Loaders::new([("a/b".to_string(), "cat".to_string())]).is_err());
        assert!(Loaders::new([("x".to_string(), "  ".to_string())]).is_err());
    }

    #[test]
    fn output_becomes_the_document_and_the_path_is_only_an_argument() {
        let dir = tempfile::tempdir().unwrap();
        // A hostile name: were it pasted into the command, the shell would run `touch`.
        let name = "a; touch pwned; b $(touch pwned2).note";
        let path = dir.path().join(name);
        std::fs::write(&path, "line one\nline two\n").unwrap();
        let doc = run("tr a-z A-Z < \"$1\"", &path, &limits(20_000)).unwrap();
        assert_eq!(doc.kind, DocKind::Text);
        assert_eq!(text_of(&doc), "LINE ONE\nLINE TWO");
        assert!(!dir.path().join("pwned").exists());
        assert!(!Path::new("pwned2").exists());
    }

    #[test]
    fn failures_timeouts_and_floods_are_skips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.note");
        std::fs::write(&path, "x").unwrap();
        let e = run("echo broken >&2; exit 3", &path, &limits(20_000)).unwrap_err();
        assert_eq!(e.reason, SkipReason::ParseError);
        assert!(e.detail.contains("broken"), "{}", e.detail);
        let e = run("true", &path, &limits(20_000)).unwrap_err();
        assert_eq!(e.reason, SkipReason::Empty);
        let started = Instant::now();
        let e = run("sleep 30; echo late", &path, &limits(300)).unwrap_err();
        assert_eq!(e.reason, SkipReason::Timeout);
        assert!(started.elapsed() < Duration::from_secs(20));
        // A background child holding stdout open is killed with the group.
        let e = run("(sleep 30; echo x) & echo now", &path, &limits(300)).unwrap_err();
        assert_eq!(e.reason, SkipReason::Timeout);
        let small = ParseLimits {
            max_text_bytes: 1000,
            ..limits(20_000)
        };
        let e = run("yes hello", &path, &small).unwrap_err();
        assert_eq!(e.reason, SkipReason::TooLarge);
        let e = run("head -c 100 /dev/zero", &path, &limits(20_000)).unwrap_err();
        assert_eq!(e.reason, SkipReason::Binary);
    }
}
