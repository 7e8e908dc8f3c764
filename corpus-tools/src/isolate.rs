//! Running one parser in isolation: a worker process killed on timeout (see
//! [`crate::worker`]; binaries opt in), else its own thread; `catch_unwind`, a time limit
//! and a cap on the extracted text either way. A panicking, looping or exploding parser
//! costs one skipped file, never the indexing run.

use crate::detect::{DocKind, Skip, SkipReason};
pub use crate::direct::ParseLimits;
use crate::direct::{check_output, parse_direct};
use crate::parse::{parse_bytes, ParsedDoc};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

/// Detect the format of `bytes` (named `path`), decode and parse it in isolation (or run
/// the loader command configured for its extension on `path`): in a worker process when the binary registered one ([`crate::worker::init_or_serve`]), which
/// is killed on timeout; otherwise on its own thread, which is abandoned on timeout.
pub fn parse_isolated(
    path: &Path,
    bytes: Vec<u8>,
    limits: &ParseLimits,
) -> Result<ParsedDoc, SkipReason> {
    parse_isolated_detailed(path, bytes, limits).map_err(|s| s.reason)
}

/// [`parse_isolated`], with what exactly made a skipped file a skip.
pub fn parse_isolated_detailed(
    path: &Path,
    bytes: Vec<u8>,
    limits: &ParseLimits,
) -> Result<ParsedDoc, Skip> {
    // A configured command is its own process: isolated already.
    if let Some(command) = limits.loaders.for_path(path) {
        return crate::loader::run(command, path, limits);
    }
    if let Some(program) = crate::worker::program() {
        if let Some(r) = crate::worker::parse_in_worker(program, path, &bytes, limits) {
            return r;
        }
    }
    let path = path.to_path_buf();
    let limits_in = limits.clone();
    isolated(limits.timeout, move || {
        parse_direct(&path, bytes, &limits_in, parse_bytes)
    })
}

/// Runs `work` on its own thread under `catch_unwind` and a time limit.
fn isolated<T: Send + 'static>(
    timeout: Duration,
    work: impl FnOnce() -> Result<T, Skip> + Send + 'static,
) -> Result<T, Skip> {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("corpus-parse".into())
        .stack_size(16 << 20)
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            // The receiver may have given up (timeout); nothing to do then.
            let _ = tx.send(r);
        });
    if spawned.is_err() {
        return Err(Skip::new(
            SkipReason::ParseError,
            "could not start a parser thread",
        ));
    }
    match rx.recv_timeout(timeout) {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(SkipReason::Panic.into()),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(SkipReason::Timeout.into()),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(SkipReason::Panic.into()),
    }
}

/// The thread-isolation harness, generic over the parse function so tests can inject bad
/// parsers.
pub fn run_isolated(
    kind: DocKind,
    bytes: Vec<u8>,
    limits: &ParseLimits,
    parse: fn(DocKind, &[u8]) -> Result<ParsedDoc, String>,
) -> Result<ParsedDoc, SkipReason> {
    let doc = isolated(limits.timeout, move || {
        parse(kind, &bytes).map_err(|e| Skip::new(SkipReason::ParseError, e))
    })
    .map_err(|s| s.reason)?;
    check_output(doc, limits).map_err(|s| s.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panics(_: DocKind, _: &[u8]) -> Result<ParsedDoc, String> {
        panic!("parser bug")
    }
    fn loops(_: DocKind, _: &[u8]) -> Result<ParsedDoc, String> {
        std::thread::sleep(Duration::from_secs(3600));
        Err("unreachable".into())
    }
    fn fails(_: DocKind, _: &[u8]) -> Result<ParsedDoc, String> {
        Err("corrupt".into())
    }

    #[test]
    fn bad_parsers_become_skip_reasons() {
        // Generous limit where the parser ends on its own: a loaded CI machine may take a
        // while to even schedule the thread.
        let patient = ParseLimits {
            timeout: Duration::from_secs(60),
            ..Default::default()
        };
        let impatient = ParseLimits {
            timeout: Duration::from_millis(200),
            ..Default::default()
        };
        assert_eq!(
            run_isolated(DocKind::Text, vec![], &patient, panics),
            Err(SkipReason::Panic)
        );
        assert_eq!(
            run_isolated(DocKind::Text, vec![], &impatient, loops),
            Err(SkipReason::Timeout)
        );
        assert_eq!(
            run_isolated(DocKind::Text, vec![], &patient, fails),
            Err(SkipReason::ParseError)
        );
    }

    #[test]
    fn text_cap_and_empty() {
        let limits = ParseLimits {
            max_text_bytes: 10,
            ..Default::default()
        };
        let p = Path::new("a.txt");
        assert_eq!(
            parse_isolated(p, b"a long line of text".to_vec(), &limits),
            Err(SkipReason::TooLarge)
        );
        assert_eq!(
            parse_isolated(p, b"  \n\n".to_vec(), &limits),
            Err(SkipReason::Empty)
        );
        assert!(parse_isolated(p, b"short".to_vec(), &limits).is_ok());
    }

    #[test]
    fn gzip_documents_are_parsed_under_the_same_limits() {
        use std::io::Write;
        let gz = |data: &[u8]| {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        };
        let limits = ParseLimits {
            timeout: Duration::from_secs(60),
            ..Default::default()
        };
        let man = b".TH LS 1\n.SH NAME\nls \\- list directory contents\n.SH DESCRIPTION\nList information about the FILEs.\n";
        let doc = parse_isolated(Path::new("man1/ls.1.gz"), gz(man), &limits).unwrap();
        assert_eq!(doc.kind, DocKind::Man);
        let text: String = doc
            .sections
            .iter()
            .flat_map(|s| &s.lines)
            .map(|l| l.text.clone())
            .collect();
        assert!(text.contains("list directory contents"), "{text}");
        let md =
            parse_isolated(Path::new("README.md.gz"), gz(b"# Title\n\nbody\n"), &limits).unwrap();
        assert_eq!(md.kind, DocKind::Markdown);
        assert_eq!(
            parse_isolated(Path::new("x.tar.gz"), gz(b"data"), &limits),
            Err(SkipReason::Unsupported)
        );
        assert_eq!(
            parse_isolated(Path::new("bin.gz"), gz(&[0u8, 1, 2, 0, 255, 0]), &limits),
            Err(SkipReason::Binary)
        );
        let small = ParseLimits {
            max_text_bytes: 1 << 16,
            ..limits.clone()
        };
        assert_eq!(
            parse_isolated(Path::new("bomb.txt.gz"), gz(&vec![b'a'; 1 << 20]), &small),
            Err(SkipReason::TooLarge)
        );
        let mut corrupt = gz(b"some text long enough to be worth compressing, twice over");
        let n = corrupt.len();
        corrupt[12..n - 8].iter_mut().for_each(|b| *b ^= 0x5a);
        assert_eq!(
            parse_isolated(Path::new("c.txt.gz"), corrupt, &limits),
            Err(SkipReason::ParseError)
        );
    }

    #[test]
    fn corrupt_pdf_is_a_parse_error() {
        let r = parse_isolated(
            Path::new("x.pdf"),
            b"%PDF-1.4 garbage garbage".to_vec(),
            &ParseLimits::default(),
        );
        assert_eq!(r, Err(SkipReason::ParseError));
    }
}
