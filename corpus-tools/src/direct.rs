//! One file's detection, decompression, decoding, parsing and output checks, with no
//! isolation around them: what both isolation forms run, the thread in [`crate::isolate`]
//! and the worker process in [`crate::worker`].

use crate::detect::{detect, DocKind, Skip, SkipReason};
use crate::parse::ParsedDoc;
use std::path::Path;
use std::time::Duration;

/// Caps on one file: its size, its extracted text and the time its parse may take.
#[derive(Debug, Clone)]
pub struct ParseLimits {
    /// Files larger than this are skipped unread.
    pub max_file_bytes: u64,
    /// Extracted text beyond this is an error (a small PDF can expand enormously).
    pub max_text_bytes: usize,
    /// Wall-clock limit per file; the worker process is killed after it (with thread
    /// isolation, the parser thread is abandoned).
    pub timeout: Duration,
    /// Commands that replace the built-in parser for their extensions ([`crate::loader`]).
    pub loaders: crate::loader::Loaders,
}

impl Default for ParseLimits {
    fn default() -> Self {
        ParseLimits {
            max_file_bytes: 20 << 20,
            max_text_bytes: 20 << 20,
            timeout: Duration::from_secs(10),
            loaders: Default::default(),
        }
    }
}

/// Detection, gzip, decoding, parsing and the output checks, in the calling thread (the
/// isolation around it is the caller's). Decompression is capped at the smaller of the
/// file and text limits.
pub(crate) fn parse_direct(
    path: &Path,
    bytes: Vec<u8>,
    limits: &ParseLimits,
    parse: fn(DocKind, &[u8]) -> Result<ParsedDoc, String>,
) -> Result<ParsedDoc, Skip> {
    let (kind, bytes) = if crate::gz::is_gzip_doc(path, &bytes) {
        let cap = limits.max_text_bytes.min(limits.max_file_bytes as usize);
        let plain = crate::gz::gunzip_capped(&bytes, cap)?;
        detect(&crate::gz::inner_name(path), plain)?
    } else {
        detect(path, bytes)?
    };
    let doc = parse(kind, &bytes).map_err(|e| Skip::new(SkipReason::ParseError, e))?;
    check_output(doc, limits)
}

/// Extracted text over the cap, or none at all, is a skip.
pub(crate) fn check_output(doc: ParsedDoc, limits: &ParseLimits) -> Result<ParsedDoc, Skip> {
    let text_bytes: usize = doc
        .sections
        .iter()
        .flat_map(|s| s.lines.iter())
        .map(|l| l.text.len() + 1)
        .sum();
    if text_bytes > limits.max_text_bytes {
        return Err(Skip::new(
            SkipReason::TooLarge,
            format!("extracted text over {} MiB", limits.max_text_bytes >> 20),
        ));
    }
    if doc.is_empty() {
        let pages = doc.sections.iter().filter(|s| s.page.is_some()).count();
        if doc.kind == DocKind::Pdf && pages > 0 {
            return Err(Skip::new(
                SkipReason::Empty,
                format!("no text layer (scanned?), {pages} page{}", plural(pages)),
            ));
        }
        return Err(SkipReason::Empty.into());
    }
    Ok(doc)
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
