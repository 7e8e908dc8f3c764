//! The paragraph walk shared by the DOCX and ODT parsers. Both formats are paragraphs
//! (some of them headings) that may nest (text boxes, frames, notes) and tables whose rows
//! become lines; they differ only in element names and in how text is written. A format
//! maps its elements to [`Tag`]s and this module does the rest: the paragraph stack and
//! its depth budget, elements whose content is left out, and where a closed paragraph's
//! text goes (a heading, a line or a table cell). EPUB's XHTML blocks nest with text
//! between them, so it ends lines itself and shares only [`Skip`] and [`Table`].

use super::xml::{
    collapse_spaces, next, reader, text_of, too_deep, Outline, Skip, Table, MAX_NESTING,
};
use quick_xml::events::{BytesStart, Event};
use std::borrow::Cow;

/// What a start tag is to the walk.
pub enum Tag {
    /// Its content (tags and text) is left out.
    Skipped,
    /// A paragraph; a heading of that level when it has one.
    Paragraph(Option<u8>),
    /// Sets the heading level of the open paragraph (a style or outline level).
    Level(Option<u8>),
    /// Text the element stands for (a tab, a line break, repeated spaces).
    Insert(Cow<'static, str>),
    /// Its character data is text (with [`Text::InRuns`]).
    Run,
    Table,
    Cell,
    /// Anything else: its content is walked, the tag itself means nothing.
    Other,
}

/// What an end tag closes.
pub enum Close {
    Paragraph,
    Run,
    Cell,
    Row,
    Table,
    Other,
}

/// Which character data is text, and how it is written.
#[derive(Clone, Copy)]
pub enum Text {
    /// Only inside [`Tag::Run`] elements, as written (Word: `w:t`, whose spaces count).
    InRuns,
    /// Anywhere in a paragraph, runs of whitespace collapsed to one space (ODF).
    Collapsed,
}

/// An open paragraph.
struct Paragraph {
    text: String,
    level: Option<u8>,
}

/// Walks the XML part `part` into `outline`: `start` maps a start tag, `close` the
/// lowercased local name of an end tag.
pub fn walk(
    xml: &str,
    part: &str,
    text: Text,
    outline: &mut Outline,
    mut start: impl FnMut(&BytesStart) -> Tag,
    close: impl Fn(&[u8]) -> Close,
) -> Result<(), String> {
    let mut r = reader(xml);
    // Open paragraphs: a text box, frame or note inside a paragraph holds paragraphs of
    // its own.
    let mut paras: Vec<Paragraph> = Vec::new();
    let mut table = Table::default();
    let mut skip = Skip::default();
    let mut in_run = false;
    loop {
        let ev = next(&mut r, part)?;
        match &ev {
            Event::Start(e) => {
                if skip.start() {
                    continue;
                }
                match start(e) {
                    Tag::Skipped => skip.begin(),
                    Tag::Paragraph(_) if paras.len() >= MAX_NESTING => return Err(too_deep(part)),
                    Tag::Paragraph(level) => paras.push(Paragraph {
                        text: String::new(),
                        level,
                    }),
                    Tag::Level(level) => {
                        if let Some(p) = paras.last_mut() {
                            p.level = level;
                        }
                    }
                    Tag::Insert(s) => {
                        if let Some(p) = paras.last_mut() {
                            p.text.push_str(&s);
                        }
                    }
                    Tag::Run => in_run = true,
                    Tag::Table => table.start_table(),
                    Tag::Cell => table.start_cell(),
                    Tag::Other => {}
                }
            }
            Event::End(e) => {
                if skip.end() {
                    continue;
                }
                match close(&e.local_name().as_ref().to_ascii_lowercase()) {
                    Close::Run => in_run = false,
                    Close::Paragraph => {
                        if let Some(p) = paras.pop() {
                            if !table.take_paragraph(&p.text) {
                                match p.level {
                                    Some(level) => outline.heading(level, &p.text),
                                    None => outline.line(&p.text),
                                }
                            }
                        }
                    }
                    Close::Cell => table.end_cell(),
                    Close::Row => {
                        if let Some(row) = table.end_row() {
                            outline.line(&row);
                        }
                    }
                    Close::Table => table.end_table(),
                    Close::Other => {}
                }
            }
            Event::Eof => return Ok(()),
            ev if !skip.active() => {
                let (Some(t), Some(p)) = (text_of(ev), paras.last_mut()) else {
                    continue;
                };
                match text {
                    Text::InRuns if in_run => p.text.push_str(&t),
                    Text::InRuns => {}
                    Text::Collapsed => collapse_spaces(&t, &mut p.text),
                }
            }
            _ => {}
        }
    }
}
