//! Parsing in a child process that can be killed: the strong form of parser isolation.
//!
//! A binary opts in by calling [`init_or_serve`] first thing in `main`. Started normally, it
//! records its own executable as the worker program; started with [`WORKER_ARG`], it serves
//! parse requests on stdin/stdout until stdin closes. [`crate::parse_isolated`] then sends
//! each file to an idle worker (kept alive between files, so small files cost one pipe round
//! trip, not one process); a worker that exceeds the time limit is killed (SIGKILL) and a
//! worker that dies (abort, segfault, OOM kill) costs only its file (`crashed`). Libraries
//! embedded in binaries that never call [`init_or_serve`] keep the thread isolation: a
//! looping parser thread is abandoned there, not killed.
//!
//! A worker never outlives its parent: on Linux it asks for SIGKILL when the parent dies
//! (`PR_SET_PDEATHSIG`), and everywhere it exits as soon as its stdin closes, even in the
//! middle of a parse (a reader thread watches the pipe). Workers are started from one
//! long-lived thread because Linux sends the parent-death signal when the *thread* that
//! started the child exits, not the process.
//!
//! Frames on both pipes: u32 length (LE) + payload. Request: path, limits, bytes. Response:
//! 0 + encoded [`ParsedDoc`], or 1 + skip reason + its detail.

use crate::detect::{DocKind, Skip, SkipReason};
use crate::direct::{parse_direct, ParseLimits};
use crate::parse::{parse_bytes, Line, ParsedDoc, Section};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Mutex, OnceLock};

/// First argument that turns a binary into a parse worker.
pub const WORKER_ARG: &str = "__corpus-tools-parse-worker";
/// `thread` forces thread isolation even when a worker program is registered.
pub const ISOLATION_ENV: &str = "RAG_PARSE_ISOLATION";
/// Test hook, read by workers only: when set, a file whose text starts with
/// `RAG-TEST-FAULT:loop`, `:panic` or `:abort` makes the worker do that instead of parsing.
pub const FAULTS_ENV: &str = "RAG_PARSE_TEST_FAULTS";

/// Address space a worker may map, in MiB (default [`DEFAULT_WORKER_MEMORY_MB`]). A parser
/// that inflates a bomb past it (lopdf decompresses a PDF's object streams before any of
/// our caps apply) fails its allocation, the worker aborts, and only that file is lost
/// (`crashed`) instead of the machine's memory.
pub const MEMORY_ENV: &str = "RAG_PARSE_WORKER_MEMORY_MB";
/// A 20 MiB file's parse needs well under this; the rest of the machine keeps its memory.
pub const DEFAULT_WORKER_MEMORY_MB: u64 = 4096;

/// Set by the parent for its workers: its pid, to detect a parent that died before the
/// worker asked for the parent-death signal.
const PARENT_ENV: &str = "RAG_PARSE_WORKER_PARENT";

static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
static IDLE: Mutex<Vec<Worker>> = Mutex::new(Vec::new());

/// Serve as a parse worker if started with [`WORKER_ARG`] (never returns then); otherwise
/// register the current executable as the worker program.
pub fn init_or_serve() {
    if std::env::args_os().nth(1).is_some_and(|a| a == WORKER_ARG) {
        serve();
        std::process::exit(0);
    }
    if let Ok(exe) = std::env::current_exe() {
        let _ = PROGRAM.set(exe);
    }
}

/// The worker program, when process isolation is on.
pub fn program() -> Option<&'static Path> {
    if std::env::var(ISOLATION_ENV).as_deref() == Ok("thread") {
        return None;
    }
    PROGRAM.get().map(PathBuf::as_path)
}

/// Parse `bytes` (named `path`) in a worker process of `program` under `limits`. `None`
/// when no worker could be started (the caller falls back to thread isolation).
pub fn parse_in_worker(
    program: &Path,
    path: &Path,
    bytes: &[u8],
    limits: &ParseLimits,
) -> Option<Result<ParsedDoc, Skip>> {
    let request = encode_request(path, bytes, limits);
    // An idle worker may have died since its last file (e.g. OOM-killed): one retry with a
    // fresh one, so an old death is never blamed on this file.
    for attempt in 0..2 {
        let reused = IDLE.lock().ok().and_then(|mut v| v.pop());
        let fresh = reused.is_none();
        let mut worker = match reused {
            Some(w) => w,
            None => Worker::spawn(program)?,
        };
        if worker.send(&request).is_err() {
            worker.kill();
            if fresh || attempt == 1 {
                return Some(Err(SkipReason::Crashed.into()));
            }
            continue;
        }
        return Some(match worker.responses.recv_timeout(limits.timeout) {
            Ok(frame) => {
                let r = decode_response(&frame);
                if let Ok(mut idle) = IDLE.lock() {
                    idle.push(worker);
                }
                r
            }
            Err(RecvTimeoutError::Timeout) => {
                worker.kill();
                Err(SkipReason::Timeout.into())
            }
            Err(RecvTimeoutError::Disconnected) => {
                worker.kill();
                Err(SkipReason::Crashed.into())
            }
        });
    }
    None
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    /// Response frames, read by a thread so the caller can wait with a time limit.
    responses: Receiver<Vec<u8>>,
}

type SpawnRequest = (PathBuf, mpsc::Sender<std::io::Result<Child>>);

/// Start `program` as a worker from the process-lifetime spawner thread (see the module
/// docs: the parent-death signal follows the thread that forked the child).
fn spawn_child(program: &Path) -> Option<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        let _ = std::thread::Builder::new()
            .name("corpus-parse-worker-spawner".into())
            .spawn(move || {
                for (program, reply) in rx {
                    let _ = reply.send(
                        Command::new(program)
                            .arg(WORKER_ARG)
                            .stdin(Stdio::piped())
                            .stdout(Stdio::piped())
                            // A panicking parser's message would land in the user's
                            // terminal; the skip reason is what reports it.
                            .stderr(Stdio::null())
                            .env(PARENT_ENV, std::process::id().to_string())
                            .spawn(),
                    );
                }
            });
        Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    spawner
        .lock()
        .ok()?
        .send((program.to_path_buf(), reply))
        .ok()?;
    answer.recv().ok()?.ok()
}

impl Worker {
    fn spawn(program: &Path) -> Option<Worker> {
        let mut child = spawn_child(program)?;
        let stdin = child.stdin.take()?;
        let mut stdout = child.stdout.take()?;
        let (tx, responses) = mpsc::channel();
        std::thread::Builder::new()
            .name("corpus-parse-worker-reader".into())
            .spawn(move || {
                while let Some(frame) = read_frame(&mut stdout) {
                    if tx.send(frame).is_err() {
                        break;
                    }
                }
            })
            .ok()?;
        Some(Worker {
            child,
            stdin,
            responses,
        })
    }

    fn send(&mut self, frame: &[u8]) -> std::io::Result<()> {
        write_frame(&mut self.stdin, frame)?;
        self.stdin.flush()
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Ask the kernel to SIGKILL this process when its parent (thread) dies.
#[cfg(target_os = "linux")]
fn die_with_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG, sig) takes an integer signal number and touches no
    // memory of ours; a failure (returned, never a fault) only loses the signal, and the
    // stdin watcher below still ends the worker.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    // The parent may have died before the call: then we were re-parented already.
    let parent = std::env::var(PARENT_ENV)
        .ok()
        .and_then(|p| p.parse::<u32>().ok());
    if parent.is_some_and(|p| p != std::os::unix::process::parent_id()) {
        std::process::exit(0);
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent() {}

/// Caps this process's address space (RLIMIT_AS) at `bytes`; a failure leaves it uncapped
/// (the time limit still bounds the parse).
#[cfg(unix)]
fn limit_address_space(bytes: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit access only the struct we pass by pointer, for the
    // duration of the call; a failure is a return code, never a fault. The hard limit is
    // kept (an unprivileged process cannot raise it).
    unsafe {
        if libc::getrlimit(libc::RLIMIT_AS, &mut limit) != 0 {
            return;
        }
        limit.rlim_cur = (bytes as libc::rlim_t).min(limit.rlim_max);
        libc::setrlimit(libc::RLIMIT_AS, &limit);
    }
}

#[cfg(not(unix))]
fn limit_address_space(_bytes: u64) {}

/// The worker loop: one response per request until stdin closes. Requests are read by a
/// thread that exits the process at end of input, so a worker stuck in a parse still ends
/// when its parent goes away.
fn serve() {
    die_with_parent();
    let mb = std::env::var(MEMORY_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(DEFAULT_WORKER_MEMORY_MB);
    limit_address_space(mb << 20);
    let faults = std::env::var_os(FAULTS_ENV).is_some();
    let (tx, requests) = mpsc::sync_channel::<Vec<u8>>(1);
    let reader = std::thread::Builder::new()
        .name("corpus-parse-worker-stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            while let Some(frame) = read_frame(&mut stdin) {
                if tx.send(frame).is_err() {
                    return;
                }
            }
            std::process::exit(0);
        });
    if reader.is_err() {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    for frame in requests {
        let result = match decode_request(&frame) {
            Some((path, limits, bytes)) => {
                let parse = if faults { faulty_parse } else { parse_bytes };
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    parse_direct(&path, bytes, &limits, parse)
                }))
                .unwrap_or(Err(SkipReason::Panic.into()))
            }
            None => Err(Skip::new(SkipReason::ParseError, "malformed request")),
        };
        let out = encode_response(&result);
        if write_frame(&mut stdout, &out).is_err() || stdout.flush().is_err() {
            return;
        }
    }
}

/// [`parse_bytes`] behind the [`FAULTS_ENV`] test hook.
fn faulty_parse(kind: DocKind, bytes: &[u8]) -> Result<ParsedDoc, String> {
    const PREFIX: &[u8] = b"RAG-TEST-FAULT:";
    if let Some(rest) = bytes.strip_prefix(PREFIX) {
        if rest.starts_with(b"loop") {
            #[allow(clippy::empty_loop)]
            loop {}
        } else if rest.starts_with(b"panic") {
            panic!("injected parser panic");
        } else if rest.starts_with(b"abort") {
            std::process::abort();
        } else if rest.starts_with(b"alloc") {
            // A decompression bomb's growth: 64 MiB at a time up to 2 GiB, every page
            // touched. Under the worker's memory cap the allocation fails first.
            let mut held: Vec<Vec<u8>> = Vec::new();
            for _ in 0..32 {
                held.push(vec![1u8; 64 << 20]);
            }
            std::hint::black_box(&held);
        }
    }
    parse_bytes(kind, bytes)
}

fn write_frame(w: &mut impl Write, payload: &[u8]) -> std::io::Result<()> {
    w.write_all(&(payload.len() as u32).to_le_bytes())?;
    w.write_all(payload)
}

fn read_frame(r: &mut impl Read) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).ok()?;
    let mut buf = vec![0u8; u32::from_le_bytes(len) as usize];
    r.read_exact(&mut buf).ok()?;
    Some(buf)
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

/// Reads the length-prefixed fields of a frame; every read is bounds-checked.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        self.take(n)
    }
    fn string(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }
}

fn encode_request(path: &Path, bytes: &[u8], limits: &ParseLimits) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 64);
    put_bytes(&mut out, path.as_os_str().as_encoded_bytes());
    out.extend_from_slice(&limits.max_file_bytes.to_le_bytes());
    out.extend_from_slice(&(limits.max_text_bytes as u64).to_le_bytes());
    put_bytes(&mut out, bytes);
    out
}

fn decode_request(frame: &[u8]) -> Option<(PathBuf, ParseLimits, Vec<u8>)> {
    let mut c = Cursor(frame);
    let path = PathBuf::from(String::from_utf8_lossy(c.bytes()?).into_owned());
    let limits = ParseLimits {
        max_file_bytes: c.u64()?,
        max_text_bytes: usize::try_from(c.u64()?).ok()?,
        ..ParseLimits::default()
    };
    Some((path, limits, c.bytes()?.to_vec()))
}

const REASONS: [SkipReason; 9] = [
    SkipReason::Unsupported,
    SkipReason::Binary,
    SkipReason::TooLarge,
    SkipReason::Unreadable,
    SkipReason::ParseError,
    SkipReason::Panic,
    SkipReason::Timeout,
    SkipReason::Empty,
    SkipReason::Crashed,
];

fn encode_response(r: &Result<ParsedDoc, Skip>) -> Vec<u8> {
    let mut out = Vec::new();
    match r {
        Err(skip) => {
            out.push(1);
            out.push(REASONS.iter().position(|x| *x == skip.reason).unwrap_or(4) as u8);
            put_bytes(&mut out, skip.detail.as_bytes());
        }
        Ok(doc) => {
            out.push(0);
            out.push(doc.kind.index() as u8);
            out.push(doc.has_line_numbers as u8);
            out.extend_from_slice(&(doc.sections.len() as u64).to_le_bytes());
            for s in &doc.sections {
                out.extend_from_slice(&(s.heading.len() as u64).to_le_bytes());
                for h in &s.heading {
                    put_bytes(&mut out, h.as_bytes());
                }
                out.extend_from_slice(&s.page.map_or(0, |p| p as u64 + 1).to_le_bytes());
                out.extend_from_slice(&(s.lines.len() as u64).to_le_bytes());
                for l in &s.lines {
                    out.extend_from_slice(&l.number.to_le_bytes());
                    put_bytes(&mut out, l.text.as_bytes());
                }
            }
        }
    }
    out
}

/// A malformed response (a worker that died mid-write) reads as a crash.
fn decode_response(frame: &[u8]) -> Result<ParsedDoc, Skip> {
    decode_response_inner(frame).unwrap_or(Err(Skip::new(
        SkipReason::Crashed,
        "malformed worker response",
    )))
}

fn decode_response_inner(frame: &[u8]) -> Option<Result<ParsedDoc, Skip>> {
    let mut c = Cursor(frame);
    if c.u8()? == 1 {
        let reason = REASONS.get(c.u8()? as usize)?.clone();
        return Some(Err(Skip::new(reason, c.string()?)));
    }
    let kind = *DocKind::ALL.get(c.u8()? as usize)?;
    let has_line_numbers = c.u8()? != 0;
    let n = c.u64()?;
    let mut sections = Vec::new();
    for _ in 0..n {
        let mut heading = Vec::new();
        for _ in 0..c.u64()? {
            heading.push(c.string()?);
        }
        let page = match c.u64()? {
            0 => None,
            p => Some(u32::try_from(p - 1).ok()?),
        };
        let mut lines = Vec::new();
        for _ in 0..c.u64()? {
            let number = c.u32()?;
            lines.push(Line {
                number,
                text: c.string()?,
            });
        }
        sections.push(Section {
            heading,
            page,
            lines,
        });
    }
    Some(Ok(ParsedDoc {
        kind,
        has_line_numbers,
        sections,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_responses_round_trip() {
        let limits = ParseLimits {
            max_file_bytes: 123,
            max_text_bytes: 456,
            ..Default::default()
        };
        let (p, l, b) =
            decode_request(&encode_request(Path::new("a/ü.md"), b"x\0y", &limits)).unwrap();
        assert_eq!(
            (p, l.max_file_bytes, l.max_text_bytes, b),
            (PathBuf::from("a/ü.md"), 123, 456, b"x\0y".to_vec())
        );
        let doc = ParsedDoc {
            kind: DocKind::Pdf,
            has_line_numbers: false,
            sections: vec![
                Section {
                    heading: vec!["A".into(), "B c".into()],
                    page: Some(0),
                    lines: vec![Line {
                        number: 7,
                        text: "héllo".into(),
                    }],
                },
                Section::default(),
            ],
        };
        assert_eq!(
            decode_response(&encode_response(&Ok(doc.clone()))),
            Ok(doc.clone())
        );
        for r in REASONS {
            let skip = Skip::new(r, "détail");
            assert_eq!(
                decode_response(&encode_response(&Err(skip.clone()))),
                Err(skip)
            );
        }
        // Every kind crosses the pipe as itself (a kind missing from `DocKind::ALL` would
        // fail `index` here, not turn into another kind).
        for (i, k) in DocKind::ALL.into_iter().enumerate() {
            assert_eq!(k.index(), i);
            let doc = ParsedDoc {
                kind: k,
                ..doc.clone()
            };
            assert_eq!(decode_response(&encode_response(&Ok(doc.clone()))), Ok(doc));
        }
    }

    #[test]
    fn truncated_or_garbage_responses_are_crashes_not_panics() {
        let full = encode_response(&Ok(ParsedDoc {
            kind: DocKind::Text,
            has_line_numbers: true,
            sections: vec![Section {
                heading: vec![],
                page: None,
                lines: vec![Line {
                    number: 1,
                    text: "text".into(),
                }],
            }],
        }));
        for n in 0..full.len() {
            assert_eq!(
                decode_response(&full[..n]).unwrap_err().reason,
                SkipReason::Crashed
            );
        }
        // A huge declared count with no data behind it stops at the first missing field.
        let mut bogus = vec![0u8, 0, 1];
        bogus.extend_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(
            decode_response(&bogus).unwrap_err().reason,
            SkipReason::Crashed
        );
        assert_eq!(
            decode_response(&[1, 200]).unwrap_err().reason,
            SkipReason::Crashed
        );
        assert!(decode_request(&[1, 2, 3]).is_none());
    }
}
