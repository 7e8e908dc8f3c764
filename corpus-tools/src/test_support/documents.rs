//! Small DOCX, ODT and EPUB files with the real package structure (content types,
//! relationships, manifests, container and OPF), written with the `zip` crate.

use std::io::Write;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

/// A block of a generated document.
#[derive(Debug, Clone, Copy)]
pub enum Block<'a> {
    /// A heading of level 1-6.
    Heading(u8, &'a str),
    Para(&'a str),
    /// A table row; consecutive rows form one table.
    Row(&'a [&'a str]),
}

/// A zip of `entries` (deflated, except entries named `mimetype`, stored first as EPUB and
/// ODF require).
pub fn zip_bytes(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut w = ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, data) in entries {
        let method = if *name == "mimetype" {
            CompressionMethod::Stored
        } else {
            CompressionMethod::Deflated
        };
        let opts = SimpleFileOptions::default().compression_method(method);
        w.start_file(*name, opts).expect("zip entry");
        w.write_all(data).expect("zip write");
    }
    w.finish().expect("zip finish").into_inner()
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Consecutive [`Block::Row`]s grouped: `Err(rows)` for a table, `Ok(block)` otherwise.
fn grouped<'a>(blocks: &'a [Block<'a>]) -> Vec<Result<Block<'a>, Vec<&'a [&'a str]>>> {
    let mut out: Vec<Result<Block, Vec<&[&str]>>> = Vec::new();
    for b in blocks {
        match (b, out.last_mut()) {
            (Block::Row(r), Some(Err(rows))) => rows.push(r),
            (Block::Row(r), _) => out.push(Err(vec![r])),
            (b, _) => out.push(Ok(*b)),
        }
    }
    out
}

/// A Word document. Headings use a style whose id is not English (`berschrift1`, as
/// German Word writes) and whose name is `heading N`, so the parser must read styles.xml.
pub fn docx_bytes(blocks: &[Block]) -> Vec<u8> {
    const W: &str = "http://schemas.openxmlformats.org/wordprocessingml/2006/main";
    let mut body = String::new();
    let para = |style: Option<String>, text: &str| {
        let ppr = style
            .map(|s| format!("<w:pPr><w:pStyle w:val=\"{s}\"/></w:pPr>"))
            .unwrap_or_default();
        // Two runs, so words are split across `w:t` as Word does.
        let (a, b) = if text.is_char_boundary(text.len() / 2) {
            text.split_at(text.len() / 2)
        } else {
            (text, "")
        };
        format!(
            "<w:p>{ppr}<w:r><w:t xml:space=\"preserve\">{}</w:t></w:r><w:r><w:t xml:space=\"preserve\">{}</w:t></w:r></w:p>",
            esc(a),
            esc(b)
        )
    };
    for g in grouped(blocks) {
        match g {
            Ok(Block::Heading(level, text)) => {
                body += &para(Some(format!("berschrift{level}")), text)
            }
            Ok(Block::Para(text)) => body += &para(None, text),
            Ok(Block::Row(_)) => {}
            Err(rows) => {
                body += "<w:tbl><w:tblPr><w:tblW w:w=\"0\" w:type=\"auto\"/></w:tblPr>";
                for row in rows {
                    body += "<w:tr>";
                    for cell in row {
                        body += &format!("<w:tc><w:tcPr/>{}</w:tc>", para(None, cell));
                    }
                    body += "</w:tr>";
                }
                body += "</w:tbl>";
            }
        }
    }
    let document = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n<w:document xmlns:w=\"{W}\"><w:body>{body}<w:sectPr/></w:body></w:document>"
    );
    let mut styles = format!("<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n<w:styles xmlns:w=\"{W}\"><w:style w:type=\"paragraph\" w:default=\"1\" w:styleId=\"Standard\"><w:name w:val=\"Normal\"/></w:style>");
    for level in 1..=6 {
        styles += &format!("<w:style w:type=\"paragraph\" w:styleId=\"berschrift{level}\"><w:name w:val=\"heading {level}\"/><w:basedOn w:val=\"Standard\"/><w:pPr><w:keepNext/></w:pPr></w:style>");
    }
    styles += "</w:styles>";
    let content_types = "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n<Types xmlns=\"http://schemas.openxmlformats.org/package/2006/content-types\"><Default Extension=\"rels\" ContentType=\"application/vnd.openxmlformats-package.relationships+xml\"/><Default Extension=\"xml\" ContentType=\"application/xml\"/><Override PartName=\"/word/document.xml\" ContentType=\"application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml\"/><Override PartName=\"/word/styles.xml\" ContentType=\"application/vnd.openxmlformats-officedocument.wordprocessingml.styles+xml\"/></Types>";
    let rels = "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n<Relationships xmlns=\"http://schemas.openxmlformats.org/package/2006/relationships\"><Relationship Id=\"rId1\" Type=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument\" Target=\"word/document.xml\"/></Relationships>";
    let doc_rels = "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n<Relationships xmlns=\"http://schemas.openxmlformats.org/package/2006/relationships\"><Relationship Id=\"rId1\" Type=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships/styles\" Target=\"styles.xml\"/></Relationships>";
    zip_bytes(&[
        ("[Content_Types].xml", content_types.as_bytes()),
        ("_rels/.rels", rels.as_bytes()),
        ("word/document.xml", document.as_bytes()),
        ("word/_rels/document.xml.rels", doc_rels.as_bytes()),
        ("word/styles.xml", styles.as_bytes()),
    ])
}

/// An OpenDocument text.
pub fn odt_bytes(blocks: &[Block]) -> Vec<u8> {
    let mut body = String::new();
    for g in grouped(blocks) {
        match g {
            Ok(Block::Heading(level, text)) => {
                body += &format!(
                    "<text:h text:style-name=\"Heading_20_{level}\" text:outline-level=\"{level}\">{}</text:h>",
                    esc(text)
                )
            }
            Ok(Block::Para(text)) => {
                // Wrapped source lines collapse to spaces in ODF.
                body += &format!(
                    "<text:p text:style-name=\"Text_20_body\">{}</text:p>\n",
                    esc(text).replacen(' ', "\n   ", 1)
                )
            }
            Ok(Block::Row(_)) => {}
            Err(rows) => {
                let cols = rows.iter().map(|r| r.len()).max().unwrap_or(0);
                body += &format!("<table:table table:name=\"Table1\"><table:table-column table:number-columns-repeated=\"{cols}\"/>");
                for row in rows {
                    body += "<table:table-row>";
                    for cell in row {
                        body += &format!("<table:table-cell office:value-type=\"string\"><text:p>{}</text:p></table:table-cell>", esc(cell));
                    }
                    body += "</table:table-row>";
                }
                body += "</table:table>";
            }
        }
    }
    let content = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<office:document-content xmlns:office=\"urn:oasis:names:tc:opendocument:xmlns:office:1.0\" xmlns:text=\"urn:oasis:names:tc:opendocument:xmlns:text:1.0\" xmlns:table=\"urn:oasis:names:tc:opendocument:xmlns:table:1.0\" office:version=\"1.3\"><office:automatic-styles/><office:body><office:text><text:sequence-decls/>{body}</office:text></office:body></office:document-content>"
    );
    let manifest = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<manifest:manifest xmlns:manifest=\"urn:oasis:names:tc:opendocument:xmlns:manifest:1.0\" manifest:version=\"1.3\"><manifest:file-entry manifest:full-path=\"/\" manifest:media-type=\"application/vnd.oasis.opendocument.text\"/><manifest:file-entry manifest:full-path=\"content.xml\" manifest:media-type=\"text/xml\"/></manifest:manifest>";
    zip_bytes(&[
        ("mimetype", b"application/vnd.oasis.opendocument.text"),
        ("META-INF/manifest.xml", manifest.as_bytes()),
        ("content.xml", content.as_bytes()),
    ])
}

/// An EPUB 3 book, one XHTML file per chapter, in `OEBPS/text/`; the spine lists them in
/// reverse manifest order, so reading order must come from the spine.
pub fn epub_bytes(chapters: &[&[Block]]) -> Vec<u8> {
    let mut files: Vec<(String, String)> = Vec::new();
    for (i, blocks) in chapters.iter().enumerate() {
        let mut body = String::new();
        for g in grouped(blocks) {
            match g {
                Ok(Block::Heading(level, text)) => {
                    body += &format!("<h{level}>{}</h{level}>\n", esc(text))
                }
                Ok(Block::Para(text)) => body += &format!("<p>{}</p>\n", esc(text)),
                Ok(Block::Row(_)) => {}
                Err(rows) => {
                    body += "<table><tbody>";
                    for row in rows {
                        body += "<tr>";
                        for cell in row {
                            body += &format!("<td>{}</td>", esc(cell));
                        }
                        body += "</tr>\n";
                    }
                    body += "</tbody></table>\n";
                }
            }
        }
        files.push((
            format!("OEBPS/text/ch{:03}.xhtml", i + 1),
            format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" xmlns:epub=\"http://www.idpf.org/2007/ops\"><head><title>Chapter {}</title><style>p {{ margin: 0 }}</style></head><body><section epub:type=\"chapter\">{body}</section></body></html>",
                i + 1
            ),
        ));
    }
    let mut manifest = String::new();
    let mut spine = String::new();
    for i in 0..chapters.len() {
        manifest += &format!(
            "<item id=\"c{}\" href=\"text/ch{:03}.xhtml\" media-type=\"application/xhtml+xml\"/>",
            i + 1,
            i + 1
        );
    }
    for i in 0..chapters.len() {
        spine += &format!("<itemref idref=\"c{}\"/>", i + 1);
    }
    let manifest: String = {
        // Reverse the manifest, keep the spine: order is the spine's.
        let mut items: Vec<&str> = manifest.split_inclusive("/>").collect();
        items.reverse();
        items.concat()
    };
    let opf = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<package xmlns=\"http://www.idpf.org/2007/opf\" version=\"3.0\" unique-identifier=\"id\"><metadata xmlns:dc=\"http://purl.org/dc/elements/1.1/\"><dc:identifier id=\"id\">urn:uuid:00000000-0000-0000-0000-000000000000</dc:identifier><dc:title>Generated book</dc:title><dc:language>en</dc:language></metadata><manifest><item id=\"css\" href=\"style.css\" media-type=\"text/css\"/>{manifest}</manifest><spine>{spine}</spine></package>"
    );
    let container = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<container version=\"1.0\" xmlns=\"urn:oasis:names:tc:opendocument:xmlns:container\"><rootfiles><rootfile full-path=\"OEBPS/content.opf\" media-type=\"application/oebps-package+xml\"/></rootfiles></container>";
    let mut entries: Vec<(&str, &[u8])> = vec![
        ("mimetype", b"application/epub+zip"),
        ("META-INF/container.xml", container.as_bytes()),
        ("OEBPS/content.opf", opf.as_bytes()),
        ("OEBPS/style.css", b"p { margin: 0 }"),
    ];
    for (name, text) in &files {
        entries.push((name, text.as_bytes()));
    }
    zip_bytes(&entries)
}
