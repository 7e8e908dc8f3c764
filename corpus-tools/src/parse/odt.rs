//! OpenDocument text -> sections: `text:h` (with its outline level) opens a section,
//! `text:p` is a line, a table row is one line of its cells. Whitespace collapses as ODF
//! says (`text:s`, `text:tab` and `text:line-break` are the explicit ones). Comments,
//! tracked deletions, note citations and image descriptions are left out; note bodies are
//! lines of their own.

use super::container::Container;
use super::paragraphs::{walk, Close, Tag, Text};
use super::xml::{attr, local, Outline};
use super::Section;
use quick_xml::events::BytesStart;

/// `text:s` repeat counts beyond this are cut (`text:c="1000000000"`).
const MAX_SPACES: usize = 64;

pub fn sections(bytes: &[u8]) -> Result<Vec<Section>, String> {
    let mut zip = Container::open(bytes, "odt")?;
    // ODF encrypts parts itself (the zip entries are not flagged): the manifest tells.
    if let Some(manifest) = zip.read_text("META-INF/manifest.xml")? {
        if manifest.contains("encryption-data") {
            return Err("odt: encrypted (password-protected)".into());
        }
    }
    let content = zip.require_text("content.xml", "odt")?;
    let mut outline = Outline::default();
    body(&content, &mut outline)?;
    Ok(outline.finish())
}

/// The paragraphs, headings and tables of `content.xml`, into `outline`.
fn body(xml: &str, outline: &mut Outline) -> Result<(), String> {
    let start = |e: &BytesStart| match local(e).as_slice() {
        b"annotation" | b"tracked-changes" | b"note-citation" | b"title" | b"desc" => Tag::Skipped,
        b"p" => Tag::Paragraph(None),
        b"h" => Tag::Paragraph(Some(
            attr(e, "outline-level")
                .and_then(|l| l.trim().parse::<u8>().ok())
                .unwrap_or(1)
                .max(1),
        )),
        b"s" => {
            let n = attr(e, "c")
                .and_then(|c| c.trim().parse::<usize>().ok())
                .unwrap_or(1)
                .min(MAX_SPACES);
            Tag::Insert(" ".repeat(n).into())
        }
        b"tab" => Tag::Insert(" ".into()),
        b"line-break" => Tag::Insert("\n".into()),
        b"table" => Tag::Table,
        b"table-cell" => Tag::Cell,
        _ => Tag::Other,
    };
    let close = |name: &[u8]| match name {
        b"p" | b"h" => Close::Paragraph,
        b"table-cell" => Close::Cell,
        b"table-row" => Close::Row,
        b"table" => Close::Table,
        _ => Close::Other,
    };
    walk(xml, "content.xml", Text::Collapsed, outline, start, close)
}
