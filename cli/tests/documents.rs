//! Word, EPUB and OpenDocument files through the real binary: `rag index` parses them in its
//! worker processes, `rag search` finds their words under their heading paths; a scanned
//! PDF is listed as having no text layer.

mod support;

use corpus_tools::test_support::{docx_bytes, epub_bytes, odt_bytes, write_scanned_pdf, Block};
use serde_json::Value;
use std::path::Path;
use support::{rag, run_ok};

fn write_corpus(d: &Path) {
    std::fs::write(
        d.join("manual.docx"),
        docx_bytes(&[
            Block::Heading(1, "Boiler"),
            Block::Heading(2, "Descaling"),
            Block::Para("Flush the heat exchanger with citric acid every spring."),
            Block::Row(&["Valve", "Torque"]),
            Block::Row(&["Bleeder", "12 Nm"]),
        ]),
    )
    .unwrap();
    std::fs::write(
        d.join("novel.epub"),
        epub_bytes(&[
            &[Block::Heading(1, "Book One"), Block::Para("Opening lines.")],
            &[
                Block::Heading(2, "The Lighthouse"),
                Block::Para("The albatross circled the lantern room at dusk."),
            ],
        ]),
    )
    .unwrap();
    std::fs::write(
        d.join("minutes.odt"),
        odt_bytes(&[
            Block::Heading(1, "Committee"),
            Block::Heading(2, "Budget"),
            Block::Para("The treasurer proposed buying a marimba for the hall."),
        ]),
    )
    .unwrap();
    write_scanned_pdf(&d.join("scan.pdf"), 2).unwrap();
}

#[test]
fn office_documents_are_indexed_and_found_under_their_headings() {
    let corpus = tempfile::tempdir().unwrap();
    write_corpus(corpus.path());
    let idx = tempfile::tempdir().unwrap();
    let out = run_ok(
        rag(&["index", "--no-dense", "--json", "--index-dir"])
            .arg(idx.path())
            .arg(corpus.path()),
    );
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["files_indexed"], 3, "{s}");
    let skipped = s["skipped_files"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{s}");
    assert!(skipped[0]["path"].as_str().unwrap().ends_with("/scan.pdf"));
    assert_eq!(skipped[0]["reason"], "empty");
    assert_eq!(skipped[0]["detail"], "no text layer (scanned?), 2 pages");

    for (word, file, heading) in [
        ("citric", "manual.docx", "Boiler > Descaling"),
        ("Bleeder", "manual.docx", "Boiler > Descaling"),
        ("albatross", "novel.epub", "Book One > The Lighthouse"),
        ("marimba", "minutes.odt", "Committee > Budget"),
    ] {
        let out = run_ok(
            rag(&["search", "--no-dense", "--json", "-k", "1", "--index-dir"])
                .arg(idx.path())
                .arg(word),
        );
        let hits: Value = serde_json::from_slice(&out.stdout).unwrap();
        let h = &hits[0];
        assert!(
            h["path"].as_str().unwrap().ends_with(&format!("/{file}")),
            "{word}: {hits}"
        );
        assert_eq!(h["heading"], heading, "{word}: {hits}");
        assert!(h["text"].as_str().unwrap().contains(word), "{word}: {hits}");
        assert!(h["page"].is_null() && h["lines"].is_null(), "{hits}");
    }

    // What a person sees: the heading in the search listing, the scan's reason in the
    // summary table of an unchanged re-run.
    let out = run_ok(
        rag(&["search", "--no-dense", "-k", "1", "--index-dir"])
            .arg(idx.path())
            .arg("albatross"),
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("Book One > The Lighthouse"), "{text}");
    let out = run_ok(
        rag(&["index", "--no-dense", "--index-dir"])
            .arg(idx.path())
            .arg(corpus.path()),
    );
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("no text layer (scanned?), 2 pages"), "{err}");
}
