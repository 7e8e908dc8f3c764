//! Word, OpenDocument and EPUB: generated documents with the real package structure, files
//! pandoc made (`tests/fixtures/pandoc-manual.*`, from one Markdown source), hostile
//! containers (bombs, entry floods, encryption, malformed XML, missing parts, path tricks),
//! random bytes and random zips; and scanned PDFs reported as having no text layer.

use corpus_tools::parse::{parse_bytes, MAX_ENTRIES, MAX_UNCOMPRESSED_BYTES};
use corpus_tools::test_support::{
    docx_bytes, epub_bytes, odt_bytes, write_scanned_pdf, zip_bytes, Block,
};
use corpus_tools::{
    chunk_doc, parse_isolated_detailed, ChunkOptions, DocKind, ParseLimits, ParsedDoc, Skip,
    SkipReason,
};
use std::path::Path;

const BLOCKS: &[Block] = &[
    Block::Para("Preface text before any heading."),
    Block::Heading(1, "Installation"),
    Block::Para("Unpack the archive & run the installer."),
    Block::Heading(2, "Requirements"),
    Block::Para("A grapefruit-sized ferrite core is required."),
    Block::Row(&["Part", "Count"]),
    Block::Row(&["Ferrite core", "2"]),
    Block::Heading(1, "Usage"),
    Block::Para("Press the <green> button twice."),
];

fn parse(name: &str, bytes: Vec<u8>) -> Result<ParsedDoc, Skip> {
    parse_isolated_detailed(Path::new(name), bytes, &ParseLimits::default())
}

/// (heading path, line) for every line.
fn lines(doc: &ParsedDoc) -> Vec<(String, String)> {
    doc.sections
        .iter()
        .flat_map(|s| {
            s.lines
                .iter()
                .map(move |l| (s.heading.join(" > "), l.text.clone()))
        })
        .collect()
}

fn heading_of(doc: &ParsedDoc, needle: &str) -> String {
    lines(doc)
        .into_iter()
        .find(|(_, l)| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in {:#?}", lines(doc)))
        .0
}

/// The generated documents, all three formats: same headings, lines and table rows.
#[test]
fn generated_documents_keep_headings_paragraphs_and_tables() {
    let want = vec![
        ("", "Preface text before any heading."),
        ("Installation", "Unpack the archive & run the installer."),
        (
            "Installation > Requirements",
            "A grapefruit-sized ferrite core is required.",
        ),
        ("Installation > Requirements", "Part | Count"),
        ("Installation > Requirements", "Ferrite core | 2"),
        ("Usage", "Press the <green> button twice."),
    ];
    for (name, bytes, kind) in [
        ("a.docx", docx_bytes(BLOCKS), DocKind::Docx),
        ("a.odt", odt_bytes(BLOCKS), DocKind::Odt),
        ("a.epub", epub_bytes(&[BLOCKS]), DocKind::Epub),
    ] {
        let doc = parse(name, bytes).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(doc.kind, kind);
        assert!(!doc.has_line_numbers);
        let got = lines(&doc);
        let got: Vec<(&str, &str)> = got.iter().map(|(h, l)| (h.as_str(), l.as_str())).collect();
        assert_eq!(got, want, "{name}");
        assert!(doc.sections.iter().all(|s| s.page.is_none()), "{name}");
        let chunks = chunk_doc(
            &doc,
            &ChunkOptions::default(),
            &corpus_tools::tokens::estimate_tokens,
        );
        let c = chunks.iter().find(|c| c.text.contains("ferrite")).unwrap();
        assert_eq!(
            c.heading.as_deref(),
            Some("Installation > Requirements"),
            "{name}"
        );
        assert_eq!((c.lines, c.page), (None, None), "{name}");
    }
}

/// Reading order is the spine's (the manifest lists the chapters in reverse), and the
/// heading path runs on from one chapter file into the next.
#[test]
fn epub_chapters_follow_the_spine() {
    let book = epub_bytes(&[
        &[
            Block::Heading(1, "Part One"),
            Block::Para("First chapter text."),
        ],
        &[
            Block::Heading(2, "The Second Chapter"),
            Block::Para("Second chapter text."),
        ],
        &[Block::Para("Continuation without a heading.")],
    ]);
    let doc = parse("book.epub", book).unwrap();
    let got = lines(&doc);
    assert_eq!(
        got,
        [
            ("Part One", "First chapter text."),
            ("Part One > The Second Chapter", "Second chapter text."),
            (
                "Part One > The Second Chapter",
                "Continuation without a heading."
            ),
        ]
        .map(|(h, l)| (h.to_string(), l.to_string()))
    );
}

fn fixture(name: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Files written by a real converter (pandoc 2.17: its Word styles, LibreOffice-style ODF,
/// EPUB 3 with a title page, nav and footnotes).
#[test]
fn pandoc_documents() {
    let docx = parse("manual.docx", fixture("pandoc-manual.docx")).unwrap();
    assert_eq!(
        heading_of(&docx, "Fresnel lens"),
        "Lighthouse Keeping Manual > Lamp maintenance > Cleaning the lens"
    );
    assert_eq!(
        heading_of(&docx, "Lens prisms"),
        "Lighthouse Keeping Manual > Lamp maintenance > Cleaning the lens"
    );
    assert!(lines(&docx)
        .iter()
        .any(|(_, l)| l == "Lens prisms | weekly"));
    assert_eq!(
        heading_of(&docx, "oil level"),
        "Lighthouse Keeping Manual > Fog signals > Diaphone compressor"
    );
    assert_eq!(
        heading_of(&docx, "scratches the prisms"),
        "Lighthouse Keeping Manual > Footnotes"
    );

    let odt = parse("manual.odt", fixture("pandoc-manual.odt")).unwrap();
    assert_eq!(
        heading_of(&odt, "Fresnel lens"),
        "Lamp maintenance > Cleaning the lens"
    );
    assert!(lines(&odt).iter().any(|(_, l)| l == "Lens prisms | weekly"));
    // pandoc wraps source lines; ODF collapses the newline to a space.
    assert!(lines(&odt)
        .iter()
        .any(|(_, l)| l == "The keeper trims the wick of the lamp every evening before sunset."));
    assert_eq!(
        heading_of(&odt, "oil level"),
        "Fog signals > Diaphone compressor"
    );

    let epub = parse("manual.epub", fixture("pandoc-manual.epub")).unwrap();
    assert_eq!(
        heading_of(&epub, "Fresnel lens"),
        "Lamp maintenance > Cleaning the lens"
    );
    assert!(lines(&epub)
        .iter()
        .any(|(_, l)| l == "Lens prisms | weekly"));
    assert_eq!(
        heading_of(&epub, "oil level"),
        "Fog signals > Diaphone compressor"
    );
    // The title page (a heading alone) comes first in the spine, then chapter one; the
    // stylesheet in <head> is not text.
    assert_eq!(
        lines(&epub)[0],
        (
            "Lamp maintenance".to_string(),
            "The keeper trims the wick of the lamp every evening before sunset.".to_string()
        )
    );
    assert!(!lines(&epub).iter().any(|(_, l)| l.contains("white-space")));
}

fn parse_error(name: &str, bytes: Vec<u8>) -> String {
    match parse(name, bytes) {
        Err(s) if s.reason == SkipReason::ParseError => s.detail,
        other => panic!("{name}: expected a parse error, got {other:?}"),
    }
}

/// A zip whose one entry inflates past the budget, and a book whose chapters do together.
#[test]
fn zip_bombs_stop_at_the_uncompressed_budget() {
    let huge = vec![b' '; MAX_UNCOMPRESSED_BYTES as usize + 1];
    let bomb = zip_bytes(&[("word/document.xml", &huge)]);
    assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
    let e = parse_error("bomb.docx", bomb);
    assert!(e.contains("over 64 MiB uncompressed"), "{e}");

    // 70 chapters of 1 MiB each: every one is fine, together they are over.
    let mb = format!(
        "<html xmlns=\"http://www.w3.org/1999/xhtml\"><body><p>{}</p></body></html>",
        " ".repeat(1 << 20)
    );
    let mut names = Vec::new();
    let mut items = String::new();
    let mut spine = String::new();
    for i in 0..70 {
        names.push(format!("c{i}.xhtml"));
        items += &format!(
            "<item id=\"c{i}\" href=\"c{i}.xhtml\" media-type=\"application/xhtml+xml\"/>"
        );
        spine += &format!("<itemref idref=\"c{i}\"/>");
    }
    let opf = format!("<package xmlns=\"http://www.idpf.org/2007/opf\"><manifest>{items}</manifest><spine>{spine}</spine></package>");
    let mut entries: Vec<(&str, &[u8])> = vec![
        ("mimetype", b"application/epub+zip"),
        ("content.opf", opf.as_bytes()),
    ];
    for n in &names {
        entries.push((n, mb.as_bytes()));
    }
    let e = parse_error("many.epub", zip_bytes(&entries));
    assert!(e.contains("over 64 MiB uncompressed"), "{e}");
}

#[test]
fn too_many_entries_is_an_error() {
    let names: Vec<String> = (0..=MAX_ENTRIES).map(|i| format!("f{i}")).collect();
    let entries: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b""[..])).collect();
    let e = parse_error("flood.odt", zip_bytes(&entries));
    assert!(
        e.contains("10001 entries") && e.contains("10000 entry limit"),
        "{e}"
    );
    // One under the limit is read (and fails for its missing part, not its size).
    let e = parse_error("flood.odt", zip_bytes(&entries[..MAX_ENTRIES]));
    assert!(e.contains("missing part content.xml"), "{e}");
}

/// Set the "encrypted" flag of every entry, in the local and the central headers.
fn flag_encrypted(mut zip: Vec<u8>) -> Vec<u8> {
    let mut i = 0;
    while i + 10 <= zip.len() {
        match &zip[i..i + 4] {
            b"PK\x03\x04" => zip[i + 6] |= 1,
            b"PK\x01\x02" => zip[i + 8] |= 1,
            _ => {}
        }
        i += 1;
    }
    zip
}

#[test]
fn encrypted_documents_are_named_as_such() {
    let e = parse_error("locked.docx", flag_encrypted(docx_bytes(BLOCKS)));
    assert!(e.contains("encrypted"), "{e}");
    let e = parse_error("locked.epub", flag_encrypted(epub_bytes(&[BLOCKS])));
    assert!(e.contains("encrypted"), "{e}");
    // ODF encrypts inside the package; the manifest says so.
    let manifest = "<manifest:manifest xmlns:manifest=\"urn:oasis:names:tc:opendocument:xmlns:manifest:1.0\"><manifest:file-entry manifest:full-path=\"content.xml\"><manifest:encryption-data manifest:checksum-type=\"SHA1/1K\"/></manifest:file-entry></manifest:manifest>";
    let odt = zip_bytes(&[
        ("mimetype", b"application/vnd.oasis.opendocument.text"),
        ("META-INF/manifest.xml", manifest.as_bytes()),
        ("content.xml", b"\x8f\x01garbage"),
    ]);
    let e = parse_error("locked.odt", odt);
    assert!(e.contains("encrypted"), "{e}");
    // Word's password-protected files are OLE2 containers, whatever the extension.
    let ole = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1\0\0\0\0".to_vec();
    assert_eq!(
        parse("locked.docx", ole).unwrap_err(),
        Skip::new(
            SkipReason::Unsupported,
            "encrypted or legacy Office file (OLE2 container)"
        )
    );
    // A DRM-encrypted chapter, listed in META-INF/encryption.xml.
    let mut book = zip_entries(&epub_bytes(&[BLOCKS]));
    book.push((
        "META-INF/encryption.xml".into(),
        br#"<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData><enc:CipherData><enc:CipherReference URI="OEBPS/text/ch001.xhtml"/></enc:CipherData></enc:EncryptedData></encryption>"#.to_vec(),
    ));
    let e = parse_error("drm.epub", rezip(&book));
    assert!(
        e.contains("encrypted (DRM) chapter OEBPS/text/ch001.xhtml"),
        "{e}"
    );
}

fn zip_entries(zip: &[u8]) -> Vec<(String, Vec<u8>)> {
    use std::io::Read;
    let mut a = zip::ZipArchive::new(std::io::Cursor::new(zip)).unwrap();
    (0..a.len())
        .map(|i| {
            let mut f = a.by_index(i).unwrap();
            let mut v = Vec::new();
            f.read_to_end(&mut v).unwrap();
            (f.name().to_string(), v)
        })
        .collect()
}

fn rezip(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let e: Vec<(&str, &[u8])> = entries
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    zip_bytes(&e)
}

fn replace(entries: &mut [(String, Vec<u8>)], name: &str, bytes: &[u8]) {
    let e = entries.iter_mut().find(|(n, _)| n == name).unwrap();
    e.1 = bytes.to_vec();
}

#[test]
fn malformed_and_missing_parts_are_clear_errors() {
    let mut docx = zip_entries(&docx_bytes(BLOCKS));
    replace(
        &mut docx,
        "word/document.xml",
        b"<w:document><w:body><w:p><w:r></w:p>",
    );
    let e = parse_error("bad.docx", rezip(&docx));
    assert!(
        e.starts_with("word/document.xml: malformed XML at byte"),
        "{e}"
    );

    // A million paragraphs each inside the last stop at a fixed depth, not in memory.
    let deep = format!(
        "<w:document xmlns:w=\"w\"><w:body>{}</w:body></w:document>",
        "<w:p>".repeat(1_000_000)
    );
    replace(&mut docx, "word/document.xml", deep.as_bytes());
    let e = parse_error("deep.docx", rezip(&docx));
    assert_eq!(e, "word/document.xml: paragraphs nested over 64 deep");

    let docx: Vec<_> = zip_entries(&docx_bytes(BLOCKS))
        .into_iter()
        .filter(|(n, _)| n != "word/document.xml")
        .collect();
    let e = parse_error("nobody.docx", rezip(&docx));
    assert_eq!(e, "docx: missing part word/document.xml");

    // Broken styles only lose the heading names: the text still counts.
    let mut docx = zip_entries(&docx_bytes(BLOCKS));
    replace(
        &mut docx,
        "word/styles.xml",
        b"<w:styles><w:style w:styleId=",
    );
    let doc = parse("nostyle.docx", rezip(&docx)).unwrap();
    assert!(lines(&doc).iter().any(|(_, l)| l.contains("ferrite")));

    let e = parse_error(
        "x.odt",
        zip_bytes(&[("mimetype", b"application/vnd.oasis.opendocument.text")]),
    );
    assert_eq!(e, "odt: missing part content.xml");
    let e = parse_error(
        "x.epub",
        zip_bytes(&[("mimetype", b"application/epub+zip")]),
    );
    assert!(e.contains("no package document"), "{e}");
    let e = parse_error("notzip.docx", b"just some text, not a zip".to_vec());
    assert_eq!(e, "docx: not a zip container");
    let e = parse_error("truncated.epub", epub_bytes(&[BLOCKS])[..200].to_vec());
    assert!(e.starts_with("epub: not a readable zip container"), "{e}");

    // A chapter that is not XML is read as HTML; a missing one is left out.
    let mut book = zip_entries(&epub_bytes(&[BLOCKS, &[Block::Para("second chapter")]]));
    replace(
        &mut book,
        "OEBPS/text/ch001.xhtml",
        b"<html><body><h1>Loose HTML</h1><p>unclosed paragraph<br><p>hedgehog</body></html>",
    );
    let book: Vec<_> = book
        .into_iter()
        .filter(|(n, _)| n != "OEBPS/text/ch002.xhtml")
        .collect();
    let doc = parse("loose.epub", rezip(&book)).unwrap();
    assert_eq!(heading_of(&doc, "hedgehog"), "Loose HTML");
    assert!(!lines(&doc)
        .iter()
        .any(|(_, l)| l.contains("second chapter")));
}

/// Spine entries that point outside the book, or to absolute URLs, are not read, even when
/// the archive holds an entry of exactly that name.
#[test]
fn paths_outside_the_book_are_not_followed() {
    let opf = r#"<package xmlns="http://www.idpf.org/2007/opf"><manifest>
        <item id="a" href="../../etc/passwd" media-type="application/xhtml+xml"/>
        <item id="b" href="http://example.com/x.xhtml" media-type="application/xhtml+xml"/>
        <item id="c" href="/abs.xhtml" media-type="application/xhtml+xml"/>
        <item id="d" href="ok%20file.xhtml#top" media-type="application/xhtml+xml"/>
        </manifest><spine><itemref idref="a"/><itemref idref="b"/><itemref idref="c"/><itemref idref="d"/></spine></package>"#;
    let page = |t: &str| {
        format!("<html xmlns=\"http://www.w3.org/1999/xhtml\"><body><p>{t}</p></body></html>")
    };
    let (secret, abs, ok) = (
        page("SECRET"),
        page("absolute but inside"),
        page("the real chapter"),
    );
    let book = zip_bytes(&[
        ("mimetype", b"application/epub+zip"),
        ("META-INF/container.xml", br#"<container xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles><rootfile full-path="OEBPS/book.opf" media-type="application/oebps-package+xml"/></rootfiles></container>"#),
        ("OEBPS/book.opf", opf.as_bytes()),
        ("../../etc/passwd", secret.as_bytes()),
        ("etc/passwd", secret.as_bytes()),
        ("abs.xhtml", abs.as_bytes()),
        ("OEBPS/ok file.xhtml", ok.as_bytes()),
    ]);
    let doc = parse("tricks.epub", book).unwrap();
    let text: Vec<String> = lines(&doc).into_iter().map(|(_, l)| l).collect();
    assert_eq!(text, ["absolute but inside", "the real chapter"]);
}

#[test]
fn detection_by_extension_and_by_mimetype_entry() {
    use corpus_tools::detect::classify;
    let epub = epub_bytes(&[BLOCKS]);
    let odt = odt_bytes(BLOCKS);
    assert_eq!(classify(Path::new("a.EPUB"), &epub), Ok(DocKind::Epub));
    assert_eq!(classify(Path::new("download"), &epub), Ok(DocKind::Epub));
    assert_eq!(classify(Path::new("download.bin2"), &odt), Ok(DocKind::Odt));
    assert_eq!(
        classify(Path::new("a.docx"), &docx_bytes(BLOCKS)),
        Ok(DocKind::Docx)
    );
    // A zip without those markers stays a zip archive.
    assert_eq!(
        classify(Path::new("download"), &zip_bytes(&[("a.txt", b"hi")])),
        Err(SkipReason::Binary)
    );
    assert_eq!(
        classify(Path::new("sheet.ods"), &odt),
        Err(SkipReason::Unsupported)
    );
}

#[test]
fn scanned_pdf_is_reported_as_having_no_text_layer() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("scan.pdf");
    write_scanned_pdf(&p, 3).unwrap();
    let skip = parse("scan.pdf", std::fs::read(&p).unwrap()).unwrap_err();
    assert_eq!(
        skip,
        Skip::new(SkipReason::Empty, "no text layer (scanned?), 3 pages")
    );
    // A PDF with text on one page of two keeps that page and its number.
    let q = dir.path().join("mixed.pdf");
    corpus_tools::test_support::write_pdf(&q, &["", "Second page has words"]).unwrap();
    let doc = parse("mixed.pdf", std::fs::read(&q).unwrap()).unwrap();
    let chunks = chunk_doc(
        &doc,
        &ChunkOptions::default(),
        &corpus_tools::tokens::estimate_tokens,
    );
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].page, Some(2));
    // Plain empty text stays a plain empty skip.
    assert_eq!(
        parse("e.txt", b"   \n".to_vec()).unwrap_err(),
        Skip::new(SkipReason::Empty, "")
    );
}

mod random {
    use super::*;
    use proptest::prelude::*;

    const KINDS: [DocKind; 3] = [DocKind::Docx, DocKind::Epub, DocKind::Odt];

    /// Names the parsers look for, so random entries get read.
    const NAMES: &[&str] = &[
        "_rels/.rels",
        "word/document.xml",
        "word/_rels/document.xml.rels",
        "word/styles.xml",
        "word/footnotes.xml",
        "content.xml",
        "META-INF/manifest.xml",
        "META-INF/container.xml",
        "META-INF/encryption.xml",
        "OEBPS/content.opf",
        "content.opf",
        "OEBPS/text/ch001.xhtml",
        "c.xhtml",
        "mimetype",
    ];

    /// XML-ish text made of the tags these formats use, nested at random and unbalanced.
    fn xmlish() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop::sample::select(vec![
            "<w:p>",
            "</w:p>",
            "<w:t>",
            "</w:t>",
            "<w:pStyle w:val=\"Heading1\"/>",
            "<w:tbl>",
            "</w:tbl>",
            "<w:tr>",
            "</w:tr>",
            "<w:tc>",
            "</w:tc>",
            "<text:h text:outline-level=\"99999\">",
            "</text:h>",
            "<text:p>",
            "</text:p>",
            "<text:s text:c=\"-1\"/>",
            "<table:table-cell>",
            "<h1>",
            "</h1>",
            "<p>",
            "</p>",
            "<td>",
            "<tr>",
            "</tr>",
            "<pre>",
            "<item id=\"c\" href=\"c.xhtml\"/>",
            "<itemref idref=\"c\"/>",
            "<rootfile full-path=\"content.opf\"/>",
            "<Relationship Type=\"x/officeDocument\" Target=\"../../x\"/>",
            "&amp;",
            "&#0;",
            "&#xFFFFFFFF;",
            "&bogus;",
            "<![CDATA[x]]>",
            "<!-- c -->",
            "<?pi x?>",
            "word ",
            "\u{0}",
            "<",
            "<!DOCTYPE x [<!ENTITY a \"&a;&a;\">]>",
            "&a;",
        ]);
        prop::collection::vec(piece, 0..60).prop_map(|v| v.concat().into_bytes())
    }

    fn name() -> impl Strategy<Value = String> {
        prop::sample::select(NAMES.to_vec()).prop_map(str::to_string)
    }

    fn content() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![prop::collection::vec(any::<u8>(), 0..200), xmlish()]
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2000)) {
            for kind in KINDS {
                let _ = parse_bytes(kind, &bytes);
                let mut zipish = b"PK\x03\x04".to_vec();
                zipish.extend_from_slice(&bytes);
                let _ = parse_bytes(kind, &zipish);
            }
        }

        #[test]
        fn random_zip_contents_never_panic(
            entries in prop::collection::btree_map(name(), content(), 0..8),
        ) {
            let entries: Vec<(String, Vec<u8>)> = entries.into_iter().collect();
            let zip = rezip(&entries);
            for kind in KINDS {
                let _ = parse_bytes(kind, &zip);
            }
        }

        /// Valid documents with bytes flipped anywhere (headers, compressed data, names).
        #[test]
        fn corrupted_documents_never_panic(
            which in 0usize..3,
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        ) {
            let (mut doc, kind) = match which {
                0 => (docx_bytes(BLOCKS), DocKind::Docx),
                1 => (odt_bytes(BLOCKS), DocKind::Odt),
                _ => (epub_bytes(&[BLOCKS]), DocKind::Epub),
            };
            for (i, b) in flips {
                let n = doc.len();
                doc[i.index(n)] ^= b | 1;
            }
            let _ = parse_bytes(kind, &doc);
        }
    }
}
