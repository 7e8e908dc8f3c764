//! Word (OOXML) -> sections. The main part is found through the package relationships;
//! paragraphs whose style is a heading (`heading N` by name, an outline level, or a style
//! based on one) open sections; other paragraphs are lines; a table row is one line of its
//! cells; footnotes follow under "Footnotes". Deleted revisions, field codes and the
//! fallback copies of text boxes are left out.

use super::container::{dir_of, resolve, Container};
use super::paragraphs::{walk, Close, Tag, Text};
use super::xml::{attr, local, next, reader, Outline};
use super::Section;
use quick_xml::events::{BytesStart, Event};
use std::collections::HashMap;

pub fn sections(bytes: &[u8]) -> Result<Vec<Section>, String> {
    let mut zip = Container::open(bytes, "docx")?;
    let main = main_part(&mut zip)?;
    let rels = relationships(&mut zip, &main)?;
    let related = |kind: &str, default: &str| {
        rels.get(kind)
            .cloned()
            .unwrap_or_else(|| format!("{}{default}", dir_of(&main)))
    };
    let styles = match zip.read_text(&related("styles", "styles.xml"))? {
        // Styles only name the heading levels: broken ones leave the built-in names.
        Some(xml) => style_levels(&xml),
        None => HashMap::new(),
    };
    let doc = zip.require_text(&main, "docx")?;
    let mut outline = Outline::default();
    body(&doc, &main, &styles, &mut outline)?;
    let footnotes = related("footnotes", "footnotes.xml");
    if let Some(xml) = zip.read_text(&footnotes)? {
        outline.heading(1, "Footnotes");
        body(&xml, &footnotes, &styles, &mut outline)?;
    }
    Ok(outline.finish())
}

/// The main document part: the package's `officeDocument` relationship, else the usual name.
fn main_part(zip: &mut Container) -> Result<String, String> {
    if let Some(xml) = zip.read_text("_rels/.rels")? {
        if let Some(target) = parse_rels(&xml, "")?.remove("officeDocument") {
            return Ok(target);
        }
    }
    Ok("word/document.xml".to_string())
}

/// The relationships of `part` (`word/_rels/document.xml.rels`), by type (last URI segment).
fn relationships(zip: &mut Container, part: &str) -> Result<HashMap<String, String>, String> {
    let dir = dir_of(part);
    let file = &part[dir.len()..];
    match zip.read_text(&format!("{dir}_rels/{file}.rels"))? {
        Some(xml) => parse_rels(&xml, dir),
        None => Ok(HashMap::new()),
    }
}

/// Internal relationships: type's last segment -> target resolved against `dir`.
fn parse_rels(xml: &str, dir: &str) -> Result<HashMap<String, String>, String> {
    let mut r = reader(xml);
    let mut out = HashMap::new();
    loop {
        match next(&mut r, "relationships")? {
            Event::Start(e) if local(&e) == b"relationship" => {
                if attr(&e, "TargetMode").is_some_and(|m| m.eq_ignore_ascii_case("external")) {
                    continue;
                }
                let (Some(kind), Some(target)) = (attr(&e, "Type"), attr(&e, "Target")) else {
                    continue;
                };
                let kind = kind.rsplit('/').next().unwrap_or_default().to_string();
                if let Some(target) = resolve(dir, &target) {
                    out.entry(kind).or_insert(target);
                }
            }
            Event::Eof => return Ok(out),
            _ => {}
        }
    }
}

/// One paragraph style as declared.
#[derive(Default)]
struct Style {
    name: String,
    based_on: Option<String>,
    outline: Option<u8>,
}

/// Paragraph style id -> heading level (0 for the document title).
fn style_levels(xml: &str) -> HashMap<String, u8> {
    let mut r = reader(xml);
    let mut styles: HashMap<String, Style> = HashMap::new();
    let mut current: Option<(String, Style)> = None;
    // A malformed styles part keeps what was read before the error.
    while let Ok(ev) = next(&mut r, "styles") {
        match ev {
            Event::Start(e) => match local(&e).as_slice() {
                b"style" => {
                    let paragraph = attr(&e, "type").is_none_or(|t| t == "paragraph");
                    current = attr(&e, "styleId")
                        .filter(|_| paragraph)
                        .map(|id| (id, Style::default()));
                }
                b"name" => {
                    if let (Some((_, s)), Some(v)) = (current.as_mut(), attr(&e, "val")) {
                        s.name = v;
                    }
                }
                b"basedon" => {
                    if let Some((_, s)) = current.as_mut() {
                        s.based_on = attr(&e, "val");
                    }
                }
                b"outlinelvl" => {
                    if let Some((_, s)) = current.as_mut() {
                        s.outline = attr(&e, "val").and_then(|v| outline_level(&v));
                    }
                }
                _ => {}
            },
            Event::End(e) if e.local_name().as_ref().eq_ignore_ascii_case(b"style") => {
                if let Some((id, s)) = current.take() {
                    styles.insert(id, s);
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    let mut levels = HashMap::new();
    for id in styles.keys() {
        // Follow `basedOn` a few steps (a cycle or a long chain ends the walk).
        let mut cur = styles.get(id);
        for _ in 0..10 {
            let Some(s) = cur else { break };
            if let Some(level) = s.outline.or_else(|| level_by_name(&s.name)) {
                levels.insert(id.clone(), level);
                break;
            }
            cur = s.based_on.as_ref().and_then(|b| styles.get(b));
        }
    }
    levels
}

/// `heading 3` -> 3 and `Title` -> 0 (Word's built-in names, the same in every UI
/// language); also the built-in ids (`Heading3`) for documents without a styles part.
fn level_by_name(name: &str) -> Option<u8> {
    let n = name.to_ascii_lowercase().replace(' ', "");
    if n == "title" {
        return Some(0);
    }
    let digit = n.strip_prefix("heading")?;
    digit.parse::<u8>().ok().filter(|l| (1..=9).contains(l))
}

/// `w:outlineLvl` is 0-based; 9 means body text.
fn outline_level(v: &str) -> Option<u8> {
    v.trim()
        .parse::<u8>()
        .ok()
        .filter(|l| *l < 9)
        .map(|l| l + 1)
}

/// The paragraphs and tables of a document (or footnotes) part, into `outline`. Deleted
/// revisions, field codes and the fallback copies of text boxes are left out.
fn body(
    xml: &str,
    part: &str,
    styles: &HashMap<String, u8>,
    outline: &mut Outline,
) -> Result<(), String> {
    let start = |e: &BytesStart| match local(e).as_slice() {
        b"deltext" | b"instrtext" | b"fallback" | b"delinstrtext" => Tag::Skipped,
        b"p" => Tag::Paragraph(None),
        b"t" => Tag::Run,
        b"pstyle" => match attr(e, "val") {
            Some(id) => Tag::Level(styles.get(&id).copied().or_else(|| level_by_name(&id))),
            None => Tag::Other,
        },
        b"outlinelvl" => match attr(e, "val") {
            Some(v) => Tag::Level(outline_level(&v)),
            None => Tag::Other,
        },
        // A run's tab; tab stops (`w:tabs/w:tab`) carry a position.
        b"tab" if attr(e, "pos").is_none() => Tag::Insert(" ".into()),
        b"br" | b"cr" => Tag::Insert("\n".into()),
        b"nobreakhyphen" => Tag::Insert("-".into()),
        b"tbl" => Tag::Table,
        b"tc" => Tag::Cell,
        _ => Tag::Other,
    };
    let close = |name: &[u8]| match name {
        b"t" => Close::Run,
        b"p" => Close::Paragraph,
        b"tc" => Close::Cell,
        b"tr" => Close::Row,
        b"tbl" => Close::Table,
        _ => Close::Other,
    };
    walk(xml, part, Text::InRuns, outline, start, close)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heading_levels_by_name_outline_and_inheritance() {
        let styles = r#"<w:styles xmlns:w="w">
            <w:style w:type="paragraph" w:styleId="berschrift1"><w:name w:val="heading 1"/></w:style>
            <w:style w:type="paragraph" w:styleId="Custom"><w:name w:val="My Heading"/><w:basedOn w:val="berschrift1"/></w:style>
            <w:style w:type="paragraph" w:styleId="Outlined"><w:name w:val="Chapter"/><w:pPr><w:outlineLvl w:val="2"/></w:pPr></w:style>
            <w:style w:type="paragraph" w:styleId="Loop1"><w:name w:val="x"/><w:basedOn w:val="Loop2"/></w:style>
            <w:style w:type="paragraph" w:styleId="Loop2"><w:name w:val="y"/><w:basedOn w:val="Loop1"/></w:style>
            <w:style w:type="paragraph" w:styleId="Title"><w:name w:val="Title"/></w:style>
            <w:style w:type="character" w:styleId="Heading1Char"><w:name w:val="heading 1"/></w:style>
        </w:styles>"#;
        let levels = style_levels(styles);
        assert_eq!(levels.get("berschrift1"), Some(&1));
        assert_eq!(levels.get("Custom"), Some(&1));
        assert_eq!(levels.get("Outlined"), Some(&3));
        assert_eq!(levels.get("Title"), Some(&0));
        assert_eq!(levels.get("Loop1"), None);
        assert_eq!(levels.get("Heading1Char"), None);
        assert_eq!(level_by_name("Heading3"), Some(3));
        assert_eq!(level_by_name("Heading10"), None);
    }
}
