//! EPUB -> sections: the package document (OPF) named by `META-INF/container.xml` gives
//! the spine, and its XHTML chapters are read in spine order. `h1`-`h6` open sections (the
//! heading path runs on across chapter files, as a book's parts and chapters do), block
//! elements end lines, a table row is one line of its cells. A chapter that is not
//! well-formed XML is read by the HTML parser instead. Chapters DRM-encrypted per
//! `META-INF/encryption.xml` make the book an error; obfuscated fonts do not.

use super::container::{dir_of, resolve, Container};
use super::xml::{attr, collapse_spaces, local, next, reader, text_of, Outline, Skip, Table};
use super::Section;
use quick_xml::events::Event;
use std::collections::{HashMap, HashSet};

pub fn sections(bytes: &[u8]) -> Result<Vec<Section>, String> {
    let mut zip = Container::open(bytes, "epub")?;
    let opf_name = package_document(&mut zip)?;
    let opf = zip.require_text(&opf_name, "epub")?;
    let chapters = spine(&opf, &opf_name)?;
    if chapters.is_empty() {
        return Err("epub: the spine lists no XHTML chapters".into());
    }
    let encrypted = encrypted_parts(&mut zip)?;
    if let Some(c) = chapters.iter().find(|c| encrypted.contains(*c)) {
        return Err(format!("epub: encrypted (DRM) chapter {c}"));
    }
    let mut outline = Outline::default();
    for chapter in &chapters {
        // A chapter the spine names but the archive lacks is left out.
        let Some(bytes) = zip.read(chapter)? else {
            continue;
        };
        let text = super::container::xml_text(&bytes);
        // Recorded first: a chapter that turns out malformed halfway adds nothing twice.
        let mut items = Vec::new();
        match xhtml(&text, chapter, &mut items) {
            Ok(()) => {
                for item in items {
                    match item {
                        Item::Heading(level, h) => outline.heading(level, &h),
                        Item::Line(l) => outline.line(&l),
                    }
                }
            }
            Err(_) => {
                for s in super::html::sections(text.as_bytes()).unwrap_or_default() {
                    if let Some(h) = s.heading.last() {
                        outline.heading(s.heading.len() as u8, h);
                    }
                    for l in &s.lines {
                        outline.line(&l.text);
                    }
                }
            }
        }
    }
    Ok(outline.finish())
}

/// The OPF's entry name: the first rootfile of the container, else any `.opf` entry.
fn package_document(zip: &mut Container) -> Result<String, String> {
    if let Some(xml) = zip.read_text("META-INF/container.xml")? {
        let mut r = reader(&xml);
        loop {
            match next(&mut r, "META-INF/container.xml")? {
                Event::Start(e) if local(&e) == b"rootfile" => {
                    let opf = attr(&e, "media-type")
                        .is_none_or(|m| m == "application/oebps-package+xml")
                        .then(|| attr(&e, "full-path"))
                        .flatten()
                        .and_then(|p| resolve("", &p));
                    if let Some(opf) = opf {
                        return Ok(opf);
                    }
                }
                Event::Eof => break,
                _ => {}
            }
        }
    }
    zip.names()
        .find(|n| n.to_ascii_lowercase().ends_with(".opf"))
        .map(str::to_string)
        .ok_or_else(|| "epub: no package document (META-INF/container.xml, .opf)".into())
}

/// The spine's chapters as entry names, in reading order, each once.
fn spine(opf: &str, opf_name: &str) -> Result<Vec<String>, String> {
    let base = dir_of(opf_name);
    let mut r = reader(opf);
    let mut items: HashMap<String, (String, Option<String>)> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    loop {
        match next(&mut r, opf_name)? {
            Event::Start(e) => match local(&e).as_slice() {
                b"item" => {
                    if let (Some(id), Some(href)) = (attr(&e, "id"), attr(&e, "href")) {
                        items.insert(id, (href, attr(&e, "media-type")));
                    }
                }
                b"itemref" => {
                    if let Some(id) = attr(&e, "idref") {
                        order.push(id);
                    }
                }
                _ => {}
            },
            Event::Eof => break,
            _ => {}
        }
    }
    let mut seen = HashSet::new();
    Ok(order
        .iter()
        .filter_map(|id| items.get(id))
        .filter(|(_, media)| {
            media.as_deref().is_none_or(|m| {
                m.eq_ignore_ascii_case("application/xhtml+xml")
                    || m.eq_ignore_ascii_case("text/html")
            })
        })
        .filter_map(|(href, _)| resolve(base, href))
        .filter(|name| seen.insert(name.clone()))
        .collect())
}

/// Entries encrypted per `META-INF/encryption.xml` (fonts obfuscated this way are common
/// and harmless here; chapters are not readable).
fn encrypted_parts(zip: &mut Container) -> Result<HashSet<String>, String> {
    let mut out = HashSet::new();
    let Some(xml) = zip.read_text("META-INF/encryption.xml")? else {
        return Ok(out);
    };
    let mut r = reader(&xml);
    // A malformed encryption list is an error: it cannot clear the chapters.
    loop {
        match next(&mut r, "META-INF/encryption.xml")? {
            Event::Start(e) if local(&e) == b"cipherreference" => {
                if let Some(uri) = attr(&e, "URI").and_then(|u| resolve("", &u)) {
                    out.insert(uri);
                }
            }
            Event::Eof => return Ok(out),
            _ => {}
        }
    }
}

/// Elements that end a line where they start and end.
const BLOCKS: &[&[u8]] = &[
    b"p",
    b"div",
    b"li",
    b"ul",
    b"ol",
    b"dl",
    b"dt",
    b"dd",
    b"blockquote",
    b"pre",
    b"section",
    b"article",
    b"aside",
    b"header",
    b"footer",
    b"nav",
    b"main",
    b"figure",
    b"figcaption",
    b"caption",
    b"address",
    b"hr",
    b"br",
    b"body",
    b"table",
    b"tr",
];

/// Elements whose text is not content.
const SKIPPED: &[&[u8]] = &[b"head", b"script", b"style", b"svg", b"rt", b"rp"];

/// What a chapter contributes, in order.
enum Item {
    Heading(u8, String),
    Line(String),
}

/// One XHTML chapter's headings and lines, into `out`.
fn xhtml(text: &str, part: &str, out: &mut Vec<Item>) -> Result<(), String> {
    let mut r = reader(text);
    let mut line = String::new();
    let mut heading: Option<(u8, String)> = None;
    let mut table = Table::default();
    let mut skip = Skip::default();
    let mut pre = 0usize;
    let flush = |line: &mut String, table: &mut Table, out: &mut Vec<Item>| {
        let l = std::mem::take(line);
        if !table.take_paragraph(&l) && !l.trim().is_empty() {
            out.push(Item::Line(l));
        }
    };
    loop {
        let ev = next(&mut r, part)?;
        match &ev {
            Event::Start(e) => {
                if skip.start() {
                    continue;
                }
                let name = local(e);
                if SKIPPED.contains(&name.as_slice()) {
                    skip.begin();
                } else if let Some(level) = heading_level(&name) {
                    flush(&mut line, &mut table, out);
                    heading = Some((level, String::new()));
                } else if BLOCKS.contains(&name.as_slice()) {
                    flush(&mut line, &mut table, out);
                    match name.as_slice() {
                        b"table" => table.start_table(),
                        b"pre" => pre += 1,
                        _ => {}
                    }
                } else if name == b"td" || name == b"th" {
                    flush(&mut line, &mut table, out);
                    table.start_cell();
                }
            }
            Event::End(e) => {
                if skip.end() {
                    continue;
                }
                let name = e.local_name().as_ref().to_ascii_lowercase();
                if heading_level(&name).is_some() {
                    if let Some((level, text)) = heading.take() {
                        out.push(Item::Heading(level, text));
                    }
                } else if BLOCKS.contains(&name.as_slice()) {
                    flush(&mut line, &mut table, out);
                    match name.as_slice() {
                        b"table" => table.end_table(),
                        b"pre" => pre = pre.saturating_sub(1),
                        b"tr" => {
                            if let Some(row) = table.end_row() {
                                out.push(Item::Line(row));
                            }
                        }
                        _ => {}
                    }
                } else if name == b"td" || name == b"th" {
                    flush(&mut line, &mut table, out);
                    table.end_cell();
                }
            }
            Event::Eof => {
                flush(&mut line, &mut table, out);
                return Ok(());
            }
            ev if !skip.active() => {
                let Some(t) = text_of(ev) else { continue };
                match heading.as_mut() {
                    Some((_, h)) => collapse_spaces(&t, h),
                    None if pre > 0 => line.push_str(&t),
                    None => collapse_spaces(&t, &mut line),
                }
            }
            _ => {}
        }
    }
}

fn heading_level(name: &[u8]) -> Option<u8> {
    match name {
        [b'h', d @ b'1'..=b'6'] => Some(d - b'0'),
        _ => None,
    }
}
