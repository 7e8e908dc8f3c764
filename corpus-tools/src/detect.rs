//! What kind of document a file is, and why a file is skipped.

use std::path::Path;

/// The parsers we have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum DocKind {
    Text,
    Markdown,
    /// reStructuredText: parsed like Markdown for its underlined (setext) headings.
    Rst,
    Html,
    Pdf,
    Code,
    /// roff man-page source (`foo.1`).
    Man,
}

impl DocKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DocKind::Text => "text",
            DocKind::Markdown => "markdown",
            DocKind::Rst => "rst",
            DocKind::Html => "html",
            DocKind::Pdf => "pdf",
            DocKind::Code => "code",
            DocKind::Man => "man",
        }
    }
}

/// Why a file produced no chunks. Counted per reason in the index summary.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    /// Known non-text format (image, archive, compressed, object file...).
    Unsupported,
    /// Content looks binary (NUL bytes or mostly invalid UTF-8).
    Binary,
    /// Larger than the configured cap.
    TooLarge,
    /// Could not be read (permissions, vanished, not a regular file).
    Unreadable,
    /// The parser reported an error (e.g. a corrupt PDF).
    ParseError,
    /// The parser panicked; the panic was contained.
    Panic,
    /// The parser exceeded its time limit; its worker process was killed (or, with thread
    /// isolation, its thread abandoned).
    Timeout,
    /// The parser's worker process died (abort, segfault, killed by the OS).
    Crashed,
    /// Parsed fine but holds no text.
    Empty,
}

impl SkipReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            SkipReason::Unsupported => "unsupported",
            SkipReason::Binary => "binary",
            SkipReason::TooLarge => "too-large",
            SkipReason::Unreadable => "unreadable",
            SkipReason::ParseError => "parse-error",
            SkipReason::Panic => "panic",
            SkipReason::Timeout => "timeout",
            SkipReason::Crashed => "crashed",
            SkipReason::Empty => "empty",
        }
    }
}

const BINARY_EXTS: &[&str] = &[
    "png",
    "jpg",
    "jpeg",
    "gif",
    "bmp",
    "ico",
    "webp",
    "tif",
    "tiff",
    "svgz",
    "gz",
    "tgz",
    "bz2",
    "xz",
    "zst",
    "lz",
    "lzma",
    "zip",
    "7z",
    "rar",
    "tar",
    "jar",
    "war",
    "deb",
    "rpm",
    "so",
    "o",
    "a",
    "dll",
    "dylib",
    "exe",
    "bin",
    "class",
    "pyc",
    "pyo",
    "wasm",
    "mp3",
    "mp4",
    "ogg",
    "wav",
    "flac",
    "avi",
    "mkv",
    "mov",
    "webm",
    "ttf",
    "otf",
    "woff",
    "woff2",
    "eot",
    "sqlite",
    "db",
    "gguf",
    "safetensors",
    "onnx",
    "pt",
    "npy",
    "npz",
    "doc",
    "docx",
    "xls",
    "xlsx",
    "ppt",
    "pptx",
    "odt",
    "ods",
    "epub",
    "mo",
    "gmo",
    "dat",
    "idx",
    "pack",
];

const CODE_EXTS: &[&str] = &[
    "rs",
    "c",
    "h",
    "cc",
    "cpp",
    "cxx",
    "hpp",
    "hh",
    "py",
    "sh",
    "bash",
    "zsh",
    "js",
    "mjs",
    "ts",
    "tsx",
    "jsx",
    "go",
    "java",
    "kt",
    "scala",
    "rb",
    "pl",
    "pm",
    "php",
    "lua",
    "swift",
    "cs",
    "m",
    "mm",
    "r",
    "jl",
    "hs",
    "ml",
    "el",
    "lisp",
    "clj",
    "sql",
    "toml",
    "yaml",
    "yml",
    "json",
    "xml",
    "css",
    "scss",
    "awk",
    "sed",
    "cmake",
    "mk",
    "make",
    "ini",
    "cfg",
    "conf",
    "cocci",
    "vim",
    "tex",
    "proto",
    "gradle",
    "bat",
    "ps1",
    "dockerfile",
];

const MARKDOWN_EXTS: &[&str] = &["md", "markdown", "mdown", "mkd", "mdx"];
const HTML_EXTS: &[&str] = &["html", "htm", "xhtml", "shtml"];

/// Decide the parser from the file name and the first bytes. Files with no or an unknown
/// extension are accepted as plain text when their content is text.
pub fn classify(path: &Path, head: &[u8]) -> Result<DocKind, SkipReason> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase())
        .unwrap_or_default();
    if ext == "pdf" || head.starts_with(b"%PDF-") {
        return Ok(DocKind::Pdf);
    }
    if BINARY_EXTS.contains(&ext.as_str()) {
        return Err(SkipReason::Unsupported);
    }
    if looks_binary(head) {
        return Err(SkipReason::Binary);
    }
    let kind = if MARKDOWN_EXTS.contains(&ext.as_str()) {
        DocKind::Markdown
    } else if ext == "rst" {
        DocKind::Rst
    } else if HTML_EXTS.contains(&ext.as_str()) {
        DocKind::Html
    } else if is_man_ext(&ext) && head.iter().take(4096).any(|&b| b == b'.') && is_roff(head) {
        DocKind::Man
    } else if CODE_EXTS.contains(&ext.as_str()) {
        DocKind::Code
    } else {
        DocKind::Text
    };
    Ok(kind)
}

fn is_man_ext(ext: &str) -> bool {
    let b = ext.as_bytes();
    ext == "man" || (!b.is_empty() && (b'1'..=b'9').contains(&b[0]) && b.len() <= 4)
}

fn is_roff(head: &[u8]) -> bool {
    let s = String::from_utf8_lossy(&head[..head.len().min(8192)]);
    s.lines().any(|l| {
        l.starts_with(".TH ")
            || l.starts_with(".SH ")
            || l.starts_with(".Dd")
            || l.starts_with(".\\\"")
    })
}

/// NUL bytes in the first 8 KiB, or more than 1% invalid UTF-8 / control characters.
pub fn looks_binary(head: &[u8]) -> bool {
    let sample = &head[..head.len().min(8192)];
    if sample.contains(&0) {
        return true;
    }
    if sample.is_empty() {
        return false;
    }
    let text = String::from_utf8_lossy(sample);
    let mut bad = 0usize;
    let mut total = 0usize;
    for c in text.chars() {
        total += 1;
        if c == char::REPLACEMENT_CHARACTER
            || (c.is_control() && !matches!(c, '\n' | '\r' | '\t' | '\x0c' | '\x08' | '\x1b'))
        {
            bad += 1;
        }
    }
    // The sample may end inside a multi-byte character: allow that one.
    bad > 1 && bad * 100 > total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_by_extension_and_content() {
        assert_eq!(classify(Path::new("a.md"), b"# hi"), Ok(DocKind::Markdown));
        assert_eq!(classify(Path::new("a.html"), b"<p>x"), Ok(DocKind::Html));
        assert_eq!(
            classify(Path::new("a.rs"), b"fn main(){}"),
            Ok(DocKind::Code)
        );
        assert_eq!(classify(Path::new("README"), b"hello"), Ok(DocKind::Text));
        assert_eq!(
            classify(Path::new("x.bin.weird"), b"ab\0cd"),
            Err(SkipReason::Binary)
        );
        assert_eq!(
            classify(Path::new("a.png"), b"text"),
            Err(SkipReason::Unsupported)
        );
        assert_eq!(
            classify(Path::new("a.gz"), b"text"),
            Err(SkipReason::Unsupported)
        );
        assert_eq!(classify(Path::new("noext"), b"%PDF-1.4"), Ok(DocKind::Pdf));
        assert_eq!(
            classify(Path::new("ls.1"), b".TH LS 1\n.SH NAME\nls"),
            Ok(DocKind::Man)
        );
        assert_eq!(
            classify(Path::new("notes.1"), b"just text"),
            Ok(DocKind::Text)
        );
    }

    #[test]
    fn invalid_utf8_is_binary_but_latin1_accent_is_not() {
        let mostly_bad: Vec<u8> = (0..200).map(|i| 0x80 + (i % 100) as u8).collect();
        assert!(looks_binary(&mostly_bad));
        let mut one_bad = b"caf".to_vec();
        one_bad.push(0xe9);
        one_bad.extend_from_slice(&[b' '; 300]);
        assert!(!looks_binary(&one_bad));
    }
}
