//! OpenDocument text -> sections: `text:h` (with its outline level) opens a section,
//! `text:p` is a line, a table row is one line of its cells. Whitespace collapses as ODF
//! says (`text:s`, `text:tab` and `text:line-break` are the explicit ones). Comments,
//! tracked deletions, note citations and image descriptions are left out; note bodies are
//! lines of their own.

use super::container::Container;
use super::xml::{
    attr, collapse_spaces, local, next, reader, text_of, too_deep, Outline, Table, MAX_NESTING,
};
use super::Section;
use quick_xml::events::Event;

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

struct Para {
    text: String,
    level: Option<u8>,
}

fn body(xml: &str, outline: &mut Outline) -> Result<(), String> {
    let mut r = reader(xml);
    // Open paragraphs: frames, text boxes and notes hold paragraphs inside paragraphs.
    let mut paras: Vec<Para> = Vec::new();
    let mut table = Table::default();
    let mut skip = 0usize;
    loop {
        let ev = next(&mut r, "content.xml")?;
        match &ev {
            Event::Start(e) => {
                if skip > 0 {
                    skip += 1;
                    continue;
                }
                match local(e).as_slice() {
                    b"annotation" | b"tracked-changes" | b"note-citation" | b"title" | b"desc" => {
                        skip = 1
                    }
                    b"p" | b"h" if paras.len() >= MAX_NESTING => {
                        return Err(too_deep("content.xml"))
                    }
                    b"p" => paras.push(Para {
                        text: String::new(),
                        level: None,
                    }),
                    b"h" => {
                        let level = attr(e, "outline-level")
                            .and_then(|l| l.trim().parse::<u8>().ok())
                            .unwrap_or(1)
                            .max(1);
                        paras.push(Para {
                            text: String::new(),
                            level: Some(level),
                        })
                    }
                    b"s" => {
                        let n = attr(e, "c")
                            .and_then(|c| c.trim().parse::<usize>().ok())
                            .unwrap_or(1)
                            .min(MAX_SPACES);
                        push_raw(&mut paras, &" ".repeat(n));
                    }
                    b"tab" => push_raw(&mut paras, " "),
                    b"line-break" => push_raw(&mut paras, "\n"),
                    b"table" => table.start_table(),
                    b"table-cell" => table.start_cell(),
                    _ => {}
                }
            }
            Event::End(e) => {
                if skip > 0 {
                    skip -= 1;
                    continue;
                }
                match e.local_name().as_ref().to_ascii_lowercase().as_slice() {
                    b"p" | b"h" => {
                        if let Some(p) = paras.pop() {
                            if table.active() {
                                table.push_text(&p.text);
                            } else if let Some(level) = p.level {
                                outline.heading(level, &p.text);
                            } else {
                                outline.line(&p.text);
                            }
                        }
                    }
                    b"table-cell" => table.end_cell(),
                    b"table-row" => {
                        if let Some(row) = table.end_row() {
                            outline.line(&row);
                        }
                    }
                    b"table" => table.end_table(),
                    _ => {}
                }
            }
            Event::Eof => return Ok(()),
            ev if skip == 0 => {
                if let (Some(t), Some(p)) = (text_of(ev), paras.last_mut()) {
                    collapse_spaces(&t, &mut p.text);
                }
            }
            _ => {}
        }
    }
}

fn push_raw(paras: &mut [Para], s: &str) {
    if let Some(p) = paras.last_mut() {
        p.text.push_str(s);
    }
}
