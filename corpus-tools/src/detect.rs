//! What kind of document a file is, and why a file is skipped.

use crate::decode::{decode, Declared, Decoded};
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
    /// Word (OOXML) document.
    Docx,
    /// EPUB book.
    Epub,
    /// OpenDocument text.
    Odt,
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
            DocKind::Docx => "docx",
            DocKind::Epub => "epub",
            DocKind::Odt => "odt",
        }
    }

    /// Every kind, in a fixed order (the worker protocol sends the position).
    pub const ALL: [DocKind; 10] = [
        DocKind::Text,
        DocKind::Markdown,
        DocKind::Rst,
        DocKind::Html,
        DocKind::Pdf,
        DocKind::Code,
        DocKind::Man,
        DocKind::Docx,
        DocKind::Epub,
        DocKind::Odt,
    ];

    /// Position in [`DocKind::ALL`]; the exhaustive match makes a new kind a compile error
    /// here until it is placed.
    pub fn index(self) -> usize {
        match self {
            DocKind::Text => 0,
            DocKind::Markdown => 1,
            DocKind::Rst => 2,
            DocKind::Html => 3,
            DocKind::Pdf => 4,
            DocKind::Code => 5,
            DocKind::Man => 6,
            DocKind::Docx => 7,
            DocKind::Epub => 8,
            DocKind::Odt => 9,
        }
    }

    /// Whether the parser takes the file's own bytes (a binary container), not decoded text.
    pub fn is_binary(self) -> bool {
        matches!(
            self,
            DocKind::Pdf | DocKind::Docx | DocKind::Epub | DocKind::Odt
        )
    }
}

/// Why a file produced no chunks. Counted per reason in the index summary.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    /// Known non-text format (image, archive, compressed, object file...).
    Unsupported,
    /// Content is not text in any encoding: a binary signature, NUL bytes outside UTF-16,
    /// or many control characters.
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
    "xls",
    "xlsx",
    "ppt",
    "pptx",
    "ods",
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

/// A skipped file: why, and what exactly (e.g. `PNG image`, `NUL bytes`, `12% control
/// characters`); `detail` may be empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip {
    pub reason: SkipReason,
    pub detail: String,
}

impl Skip {
    pub fn new(reason: SkipReason, detail: impl Into<String>) -> Self {
        Skip {
            reason,
            detail: detail.into(),
        }
    }
}

impl From<SkipReason> for Skip {
    fn from(reason: SkipReason) -> Self {
        Skip::new(reason, "")
    }
}

/// Decide the parser from the file name and content, and decode text formats: returns the
/// kind and the bytes its parser takes (UTF-8 text; the file's own bytes for PDF, DOCX,
/// EPUB and ODT). Files with no or an unknown extension are accepted as plain text when
/// their content is text.
pub fn detect(path: &Path, bytes: Vec<u8>) -> Result<(DocKind, Vec<u8>), Skip> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase())
        .unwrap_or_default();
    if ext == "pdf" || bytes.starts_with(b"%PDF-") {
        return Ok((DocKind::Pdf, bytes));
    }
    let known_binary = BINARY_EXTS.contains(&ext.as_str());
    if let Some(kind) = container_kind(&ext, &bytes, known_binary) {
        if bytes.starts_with(OLE2) {
            // Word saves password-protected documents in an OLE2 container, whatever the
            // extension.
            return Err(Skip::new(
                SkipReason::Unsupported,
                "encrypted or legacy Office file (OLE2 container)",
            ));
        }
        return Ok((kind, bytes));
    }
    if known_binary {
        return Err(Skip::new(SkipReason::Unsupported, format!(".{ext} file")));
    }
    if let Some(what) = magic(&bytes) {
        return Err(Skip::new(SkipReason::Binary, what));
    }
    let is_html = HTML_EXTS.contains(&ext.as_str());
    let declared = if is_html {
        Declared::Html
    } else {
        Declared::Xml
    };
    let head_has_nul = bytes[..bytes.len().min(HEAD)].contains(&0);
    let decoded = decode(bytes, declared);
    let utf16 =
        decoded.encoding == encoding_rs::UTF_16LE || decoded.encoding == encoding_rs::UTF_16BE;
    if head_has_nul && !utf16 {
        return Err(Skip::new(SkipReason::Binary, "NUL bytes"));
    }
    if let Some(why) = not_text(&decoded) {
        return Err(Skip::new(SkipReason::Binary, why));
    }
    let text = decoded.text;
    let kind = if MARKDOWN_EXTS.contains(&ext.as_str()) {
        DocKind::Markdown
    } else if ext == "rst" {
        DocKind::Rst
    } else if is_html {
        DocKind::Html
    } else if is_man_ext(&ext) && is_roff(&text) {
        DocKind::Man
    } else if CODE_EXTS.contains(&ext.as_str()) {
        DocKind::Code
    } else {
        DocKind::Text
    };
    Ok((kind, text.into_bytes()))
}

const OLE2: &[u8] = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1";

/// DOCX, EPUB or ODT: by extension, or (unless the extension names another binary format,
/// e.g. `.ods`) by the `mimetype` entry that EPUB and ODF put first and uncompressed in
/// their zip.
fn container_kind(ext: &str, bytes: &[u8], known_binary: bool) -> Option<DocKind> {
    match ext {
        "docx" => return Some(DocKind::Docx),
        "epub" => return Some(DocKind::Epub),
        "odt" => return Some(DocKind::Odt),
        _ if known_binary => return None,
        _ => {}
    }
    // Local file header: signature, ..., name length at 26, extra length at 28, name at 30.
    if !bytes.starts_with(b"PK\x03\x04")
        || bytes.get(26..28) != Some(&[8, 0])
        || bytes.get(30..38) != Some(b"mimetype")
    {
        return None;
    }
    let extra = u16::from_le_bytes([*bytes.get(28)?, *bytes.get(29)?]) as usize;
    let content = bytes.get(38 + extra..)?;
    if content.starts_with(b"application/epub+zip") {
        Some(DocKind::Epub)
    } else if content.starts_with(b"application/vnd.oasis.opendocument.text")
        && !content.starts_with(b"application/vnd.oasis.opendocument.text-")
    {
        Some(DocKind::Odt)
    } else {
        None
    }
}

/// The parser [`detect`] would choose for a file named `path` holding `bytes`.
pub fn classify(path: &Path, bytes: &[u8]) -> Result<DocKind, SkipReason> {
    detect(path, bytes.to_vec())
        .map(|(kind, _)| kind)
        .map_err(|s| s.reason)
}

/// Bytes of the head where a NUL byte (outside UTF-16) means binary.
const HEAD: usize = 8192;

/// File signatures of common binary formats, for files whose extension did not say.
const MAGIC: &[(&[u8], &str)] = &[
    (b"\x89PNG\r\n\x1a\n", "PNG image"),
    (b"\xff\xd8\xff", "JPEG image"),
    (b"GIF87a", "GIF image"),
    (b"GIF89a", "GIF image"),
    (b"\x7fELF", "ELF executable"),
    (b"PK\x03\x04", "zip archive"),
    (b"PK\x05\x06", "zip archive"),
    (b"\x1f\x8b", "gzip data"),
    (b"BZh", "bzip2 data"),
    (b"\xfd7zXZ\x00", "xz data"),
    (b"\x28\xb5\x2f\xfd", "zstd data"),
    (b"7z\xbc\xaf\x27\x1c", "7z archive"),
    (b"Rar!\x1a\x07", "rar archive"),
    (b"SQLite format 3\x00", "SQLite database"),
    (b"\x00asm", "WebAssembly module"),
    (b"\xca\xfe\xba\xbe", "Java class or Mach-O"),
    (b"\xcf\xfa\xed\xfe", "Mach-O executable"),
    (b"\xce\xfa\xed\xfe", "Mach-O executable"),
    (b"GGUF", "GGUF model"),
    (b"OggS", "Ogg media"),
    (b"fLaC", "FLAC audio"),
    (
        b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1",
        "OLE2 (legacy Office) file",
    ),
    (b"!<arch>\n", "ar archive"),
];

fn magic(bytes: &[u8]) -> Option<&'static str> {
    let found = MAGIC
        .iter()
        .find(|(m, _)| bytes.starts_with(m))
        .map(|(_, w)| *w);
    match found {
        // "BZh" also starts words: require the block-size digit and the block magic.
        Some("bzip2 data") => (bytes.len() >= 10
            && (b'1'..=b'9').contains(&bytes[3])
            && bytes[4..10] == *b"\x31\x41\x59\x26\x53\x59")
            .then_some("bzip2 data"),
        other => other,
    }
}

/// Why decoded content is not text: more than 1% control characters (besides tab, line
/// breaks, form feed, backspace and escape, which man pages and terminal logs use), or a
/// quarter of it undecodable.
fn not_text(d: &Decoded) -> Option<String> {
    let (mut total, mut control) = (0usize, 0usize);
    for c in d.text.chars() {
        total += 1;
        if c.is_control() && !matches!(c, '\n' | '\r' | '\t' | '\x0c' | '\x08' | '\x1b') {
            control += 1;
        }
    }
    if control > 1 && control * 100 > total {
        return Some(format!(
            "{}% control characters",
            (control * 100).div_ceil(total)
        ));
    }
    if d.replaced > 1 && d.replaced * 4 > total {
        return Some(format!(
            "{}% invalid sequences as {}",
            (d.replaced * 100).div_ceil(total),
            d.encoding.name()
        ));
    }
    None
}

fn is_man_ext(ext: &str) -> bool {
    let b = ext.as_bytes();
    ext == "man" || (!b.is_empty() && (b'1'..=b'9').contains(&b[0]) && b.len() <= 4)
}

fn is_roff(text: &str) -> bool {
    let mut end = text.len().min(8192);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let head = &text[..end];
    head.lines().any(|l| {
        l.starts_with(".TH ")
            || l.starts_with(".SH ")
            || l.starts_with(".Dd")
            || l.starts_with(".\\\"")
    })
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
    fn binaries_are_named_by_signature_nul_bytes_or_control_share() {
        let png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR";
        let elf = b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00";
        let zip = b"PK\x03\x04\x14\x00\x00\x00\x08\x00notes.txt";
        for (bytes, what) in [
            (&png[..], "PNG image"),
            (&elf[..], "ELF executable"),
            (&zip[..], "zip archive"),
        ] {
            assert_eq!(
                detect(Path::new("no-extension"), bytes.to_vec()),
                Err(Skip::new(SkipReason::Binary, what))
            );
        }
        assert_eq!(
            detect(Path::new("x.bin.weird"), b"ab\0cd".to_vec()).unwrap_err(),
            Skip::new(SkipReason::Binary, "NUL bytes")
        );
        let controls: Vec<u8> = (0..400u32)
            .map(|i| [b'a', 0x01, 0x02, b' '][i as usize % 4])
            .collect();
        let skip = detect(Path::new("x.txt"), controls).unwrap_err();
        assert_eq!(skip.reason, SkipReason::Binary);
        assert_eq!(skip.detail, "50% control characters");
        // Words that start like a signature are text.
        assert_eq!(
            classify(Path::new("n.txt"), b"BZh, said the bee"),
            Ok(DocKind::Text)
        );
    }

    proptest::proptest! {
        /// Any bytes, under any name: a kind with valid UTF-8 to parse, or a skip; never a
        /// panic (declaration scanning, UTF-16 sniffing and detection run on user input).
        #[test]
        fn any_bytes_detect_without_panicking(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000),
            prefix in proptest::sample::select(vec![
                &b""[..], b"\xEF\xBB\xBF", b"\xFF\xFE", b"<?xml encoding='", b"<meta charset=",
            ]),
            name in proptest::sample::select(vec!["a.html", "a.xml", "a.txt", "ls.1", "x"]),
        ) {
            let mut input = prefix.to_vec();
            input.extend_from_slice(&bytes);
            if let Ok((kind, out)) = detect(Path::new(name), input) {
                if !kind.is_binary() {
                    proptest::prop_assert!(std::str::from_utf8(&out).is_ok());
                }
            }
        }
    }

    #[test]
    fn legacy_text_is_decoded_not_binary() {
        let (latin1, _, _) =
            encoding_rs::WINDOWS_1252.encode("Caf\u{e9} cr\u{e8}me, d\u{e9}j\u{e0} vu\n");
        let (kind, text) = detect(Path::new("note.txt"), latin1.into_owned()).unwrap();
        assert_eq!(kind, DocKind::Text);
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "Caf\u{e9} cr\u{e8}me, d\u{e9}j\u{e0} vu\n"
        );
        let utf16: Vec<u8> = [0xFF, 0xFE]
            .into_iter()
            .chain(
                ".TH LS 1\n.SH NAME\nls\n"
                    .encode_utf16()
                    .flat_map(u16::to_le_bytes),
            )
            .collect();
        assert_eq!(classify(Path::new("ls.1"), &utf16), Ok(DocKind::Man));
    }
}
