//! XML reading shared by the DOCX, ODT and EPUB parsers (quick-xml, streaming: no tree, no
//! recursion, no DTD entity expansion), and [`Outline`], which turns headings and
//! paragraphs into [`Section`]s.

use super::{Line, Section};
use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;
use std::borrow::Cow;

/// A reader over `text` that reports `<a/>` as a start and an end, and keeps whitespace
/// (Word stores significant spaces as text runs of their own).
pub fn reader(text: &str) -> Reader<&[u8]> {
    let mut r = Reader::from_str(text);
    r.config_mut().expand_empty_elements = true;
    r
}

/// The next event, with a readable error: `part: malformed XML at byte N: ...`.
pub fn next<'a>(r: &mut Reader<&'a [u8]>, part: &str) -> Result<Event<'a>, String> {
    r.read_event()
        .map_err(|e| format!("{part}: malformed XML at byte {}: {e}", r.error_position()))
}

/// The text an event contributes: character data, CDATA, and entity or character
/// references. XML's five entities and a few HTML ones EPUB 2 books use are known; an
/// unknown entity is kept as written.
pub fn text_of<'a>(ev: &Event<'a>) -> Option<Cow<'a, str>> {
    match ev {
        Event::Text(t) => t.xml10_content().ok(),
        Event::CData(t) => t.decode().ok(),
        Event::GeneralRef(r) => {
            if let Ok(Some(c)) = r.resolve_char_ref() {
                return Some(Cow::Owned(c.to_string()));
            }
            let name = r.decode().ok()?;
            Some(match entity(&name) {
                Some(s) => Cow::Borrowed(s),
                None => Cow::Owned(format!("&{name};")),
            })
        }
        _ => None,
    }
}

fn entity(name: &str) -> Option<&'static str> {
    if let Some(s) = quick_xml::escape::resolve_xml_entity(name) {
        return Some(s);
    }
    Some(match name {
        "nbsp" => "\u{a0}",
        "shy" => "",
        "ndash" => "\u{2013}",
        "mdash" => "\u{2014}",
        "hellip" => "\u{2026}",
        "lsquo" => "\u{2018}",
        "rsquo" => "\u{2019}",
        "ldquo" => "\u{201c}",
        "rdquo" => "\u{201d}",
        "laquo" => "\u{ab}",
        "raquo" => "\u{bb}",
        "copy" => "\u{a9}",
        "reg" => "\u{ae}",
        "trade" => "\u{2122}",
        "bull" => "\u{2022}",
        "middot" => "\u{b7}",
        "deg" => "\u{b0}",
        "times" => "\u{d7}",
        "eacute" => "\u{e9}",
        "egrave" => "\u{e8}",
        "agrave" => "\u{e0}",
        "ccedil" => "\u{e7}",
        "uuml" => "\u{fc}",
        "ouml" => "\u{f6}",
        "auml" => "\u{e4}",
        "szlig" => "\u{df}",
        _ => return None,
    })
}

/// The local name (namespace prefix dropped) of an element, lowercased ASCII.
pub fn local(e: &BytesStart) -> Vec<u8> {
    e.local_name().as_ref().to_ascii_lowercase()
}

/// The value of the attribute whose local name is `name` (any namespace prefix).
pub fn attr(e: &BytesStart, name: &str) -> Option<String> {
    e.attributes().flatten().find_map(|a| {
        a.key
            .local_name()
            .as_ref()
            .eq_ignore_ascii_case(name.as_bytes())
            .then(|| {
                a.normalized_value(quick_xml::XmlVersion::Implicit1_0)
                    .map(Cow::into_owned)
                    .unwrap_or_else(|_| String::from_utf8_lossy(&a.value).into_owned())
            })
    })
}

/// Paragraphs open inside paragraphs (text boxes, notes) beyond this are an error: real
/// documents nest a few deep, a hostile one could nest millions.
pub const MAX_NESTING: usize = 64;

/// The error for [`MAX_NESTING`].
pub fn too_deep(part: &str) -> String {
    format!("{part}: paragraphs nested over {MAX_NESTING} deep")
}

/// Depth inside an element whose content (tags and text) is left out.
#[derive(Default)]
pub struct Skip(usize);

impl Skip {
    /// At the start tag of an element to leave out.
    pub fn begin(&mut self) {
        self.0 = 1;
    }
    /// At any start tag: whether it lies inside a left-out element (and is left out too).
    pub fn start(&mut self) -> bool {
        if self.0 > 0 {
            self.0 += 1;
        }
        self.0 > 1
    }
    /// At any end tag: whether it closes a left-out element or lies inside one.
    pub fn end(&mut self) -> bool {
        let inside = self.0 > 0;
        self.0 = self.0.saturating_sub(1);
        inside
    }
    /// Whether text here is left out.
    pub fn active(&self) -> bool {
        self.0 > 0
    }
}

/// Collapse runs of whitespace to one space (ODF and XHTML text; not Word runs).
pub fn collapse_spaces(s: &str, out: &mut String) {
    let mut last_space = out.ends_with(' ') || out.is_empty();
    for c in s.chars() {
        if c.is_whitespace() && c != '\u{a0}' {
            if !last_space {
                out.push(' ');
                last_space = true;
            }
        } else {
            out.push(c);
            last_space = false;
        }
    }
}

/// Deepest heading level kept: deeper ones still split sections but share one level.
const MAX_LEVEL: u8 = 9;
/// Heading text longer than this is cut (a whole paragraph styled as a heading).
const MAX_HEADING_CHARS: usize = 200;

/// Headings and lines in document order -> sections under heading paths.
#[derive(Default)]
pub struct Outline {
    sections: Vec<Section>,
    /// The open headings: (level, text), levels strictly increasing.
    path: Vec<(u8, String)>,
}

impl Outline {
    /// A heading of `level` (0 for a title above level 1, 1 = top level): closes the
    /// headings at its level and below and starts a section under the new path.
    pub fn heading(&mut self, level: u8, text: &str) {
        let text: String = text
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .chars()
            .take(MAX_HEADING_CHARS)
            .collect();
        if text.is_empty() {
            return;
        }
        let level = level.min(MAX_LEVEL);
        while self.path.last().is_some_and(|(l, _)| *l >= level) {
            self.path.pop();
        }
        self.path.push((level, text));
        self.sections.push(Section {
            heading: self.path.iter().map(|(_, t)| t.clone()).collect(),
            page: None,
            lines: Vec::new(),
        });
    }

    /// A paragraph (or table row): one line per line of `text`, blank ones dropped.
    pub fn line(&mut self, text: &str) {
        for l in text.lines() {
            let l = l.trim();
            if l.is_empty() {
                continue;
            }
            if self.sections.is_empty() {
                self.sections.push(Section::default());
            }
            if let Some(s) = self.sections.last_mut() {
                s.lines.push(Line {
                    number: 0,
                    text: l.to_string(),
                });
            }
        }
    }

    /// The sections with lines (a heading directly followed by another has none).
    pub fn finish(self) -> Vec<Section> {
        self.sections
            .into_iter()
            .filter(|s| !s.lines.is_empty())
            .collect()
    }
}

/// Table rows as lines: the cells of a row joined with ` | `. Nested tables' text joins
/// the cell of the outer table that holds them.
#[derive(Default)]
pub struct Table {
    depth: usize,
    row: Vec<String>,
    cell: String,
}

impl Table {
    pub fn active(&self) -> bool {
        self.depth > 0
    }
    pub fn start_table(&mut self) {
        self.depth += 1;
    }
    pub fn end_table(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }
    pub fn start_cell(&mut self) {
        if self.depth == 1 {
            self.cell.clear();
        }
    }
    /// A finished paragraph: inside a table it joins the open cell (true); outside one it
    /// is the caller's to write (false).
    pub fn take_paragraph(&mut self, text: &str) -> bool {
        if !self.active() {
            return false;
        }
        self.push_text(text);
        true
    }
    /// A paragraph inside a cell.
    fn push_text(&mut self, text: &str) {
        let text = text.trim();
        if !text.is_empty() {
            if !self.cell.is_empty() {
                self.cell.push(' ');
            }
            self.cell.push_str(text);
        }
    }
    pub fn end_cell(&mut self) {
        if self.depth == 1 {
            let cell = std::mem::take(&mut self.cell);
            self.row.push(cell.replace('\n', " "));
        }
    }
    /// The finished row's line, at the outer table's row end.
    pub fn end_row(&mut self) -> Option<String> {
        if self.depth != 1 {
            return None;
        }
        let row = std::mem::take(&mut self.row);
        let cells: Vec<&str> = row.iter().map(|c| c.trim()).collect();
        cells
            .iter()
            .any(|c| !c.is_empty())
            .then(|| cells.join(" | "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outline_nests_and_closes_headings() {
        let mut o = Outline::default();
        o.line("before any heading");
        o.heading(1, "A");
        o.heading(2, "  A.1\n title ");
        o.line("in a1\n\nsecond line");
        o.heading(3, "empty section");
        o.heading(2, "A.2");
        o.line("in a2");
        o.heading(1, "B");
        o.line("in b");
        let s = o.finish();
        let paths: Vec<String> = s.iter().map(|s| s.heading.join(" > ")).collect();
        assert_eq!(paths, ["", "A > A.1 title", "A > A.2", "B"]);
        assert_eq!(s[1].lines.len(), 2);
    }

    #[test]
    fn references_and_entities() {
        let mut r = reader("<p>a&amp;b&#233;&#x263A;&nbsp;&unknown;<![CDATA[<x>]]></p>");
        let mut text = String::new();
        loop {
            let ev = next(&mut r, "t").unwrap();
            if matches!(ev, Event::Eof) {
                break;
            }
            if let Some(t) = text_of(&ev) {
                text.push_str(&t);
            }
        }
        assert_eq!(text, "a&bé\u{263a}\u{a0}&unknown;<x>");
        let mut bad = reader("<p><q></p>");
        let err = loop {
            match next(&mut bad, "part.xml") {
                Ok(Event::Eof) => panic!("malformed XML read to the end"),
                Ok(_) => {}
                Err(e) => break e,
            }
        };
        assert!(err.starts_with("part.xml: malformed XML"), "{err}");
    }
}
