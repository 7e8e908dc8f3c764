//! Parsers: bytes of one file -> sections of lines, each section under a heading path.

mod container;
mod docx;
mod epub;
mod html;
mod man;
mod markdown;
mod odt;
mod paragraphs;
mod pdf;
mod xml;

pub use container::{MAX_ENTRIES, MAX_UNCOMPRESSED_BYTES};

use crate::detect::DocKind;

/// One line of extracted text; `number` is its 1-based line in the source file (0 when the
/// format has no meaningful source lines, e.g. HTML or PDF).
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub number: u32,
    pub text: String,
}

/// A run of lines under one heading path (and, for PDFs, on one page). Chunks never cross
/// section boundaries. A PDF page without extractable text is a section with no lines, so
/// a PDF whose pages are all like that reads as "no text layer", not as no pages.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Section {
    pub heading: Vec<String>,
    pub page: Option<u32>,
    pub lines: Vec<Line>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ParsedDoc {
    pub kind: DocKind,
    /// Whether `Line::number` refers to lines of the source file.
    pub has_line_numbers: bool,
    pub sections: Vec<Section>,
}

impl ParsedDoc {
    pub fn is_empty(&self) -> bool {
        self.sections
            .iter()
            .all(|s| s.lines.iter().all(|l| l.text.trim().is_empty()))
    }
}

/// Parse `bytes` as `kind`. Errors are parse failures of the format (corrupt PDF...).
pub fn parse_bytes(kind: DocKind, bytes: &[u8]) -> Result<ParsedDoc, String> {
    let text = || String::from_utf8_lossy(bytes);
    let doc = match kind {
        DocKind::Markdown => numbered(
            kind,
            markdown::sections(&text(), markdown::Flavor::Markdown),
        ),
        DocKind::Rst => numbered(kind, markdown::sections(&text(), markdown::Flavor::Rst)),
        DocKind::Text => {
            let t = text();
            let sections = if man::looks_like_rendered_man(&t) {
                man::rendered_sections(&t)
            } else {
                vec![plain_section(&t)]
            };
            numbered(kind, sections)
        }
        DocKind::Code => numbered(kind, vec![plain_section(&text())]),
        DocKind::Man => numbered(kind, man::roff_sections(&text())),
        DocKind::Html => unnumbered(kind, html::sections(bytes)?),
        DocKind::Pdf => unnumbered(kind, pdf::sections(bytes)?),
        DocKind::Docx => unnumbered(kind, docx::sections(bytes)?),
        DocKind::Epub => unnumbered(kind, epub::sections(bytes)?),
        DocKind::Odt => unnumbered(kind, odt::sections(bytes)?),
    };
    Ok(doc)
}

fn numbered(kind: DocKind, sections: Vec<Section>) -> ParsedDoc {
    ParsedDoc {
        kind,
        has_line_numbers: true,
        sections,
    }
}

fn unnumbered(kind: DocKind, sections: Vec<Section>) -> ParsedDoc {
    ParsedDoc {
        kind,
        has_line_numbers: false,
        sections,
    }
}

fn plain_section(text: &str) -> Section {
    Section {
        heading: Vec::new(),
        page: None,
        lines: text
            .lines()
            .enumerate()
            .map(|(i, l)| Line {
                number: i as u32 + 1,
                text: l.to_string(),
            })
            .collect(),
    }
}
