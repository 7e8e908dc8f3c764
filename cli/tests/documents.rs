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

/// A `[loaders]` command from the config file reads a format we have no parser for (and
/// replaces one we have); changing the command re-reads those files, and only those.
#[test]
fn loader_commands_from_the_config_file_index_other_formats() {
    let corpus = tempfile::tempdir().unwrap();
    let d = corpus.path();
    // A "format" only the loader understands: text with NUL bytes, binary to us.
    std::fs::write(d.join("notes.rev"), "the\0 blue\0 lobsters\0\nexpression\n").unwrap();
    std::fs::write(d.join("plain.txt"), "An ordinary kestrel note.\n").unwrap();
    let cfg = tempfile::tempdir().unwrap();
    let config = cfg.path().join("config.toml");
    let idx = tempfile::tempdir().unwrap();
    let index = |config_text: &str| -> Value {
        std::fs::write(&config, config_text).unwrap();
        let out = run_ok(
            rag(&["index", "--no-dense", "--json", "--index-dir"])
                .arg(idx.path())
                .arg(d)
                .env("RAG_CONFIG", &config),
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let search = |word: &str| -> Value {
        let out = run_ok(
            rag(&["search", "--no-dense", "--json", "-k", "1", "--index-dir"])
                .arg(idx.path())
                .arg(word),
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };

    let s = index("");
    assert_eq!(s["files_indexed"], 1, "{s}");
    assert_eq!(s["skipped_files"][0]["reason"], "binary", "{s}");

    let s = index("[loaders]\nrev = \"tr -d '\\\\000' < \\\"$1\\\"\"\n");
    assert_eq!(s["files_indexed"], 1, "only the .rev file is re-read: {s}");
    let hits = search("lobsters");
    assert!(
        hits[0]["path"].as_str().unwrap().ends_with("/notes.rev"),
        "{hits}"
    );
    assert!(
        hits[0]["text"]
            .as_str()
            .unwrap()
            .contains("the blue lobsters"),
        "{hits}"
    );

    // Unchanged config: nothing re-read. A failing command: a skip naming it.
    let s = index("[loaders]\nrev = \"tr -d '\\\\000' < \\\"$1\\\"\"\n");
    assert_eq!(s["files_indexed"], 0, "{s}");
    let s = index("[loaders]\nrev = \"echo no such tool >&2; exit 127\"\n");
    assert_eq!(s["skipped_files"][0]["reason"], "parse-error", "{s}");
    assert!(
        s["skipped_files"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("no such tool"),
        "{s}"
    );

    // A loader for an extension we parse ourselves replaces our parser.
    let s = index("[loaders]\ntxt = \"tr a-z A-Z < \\\"$1\\\"\"\n");
    assert_eq!(s["files_indexed"], 1, "{s}");
    assert!(search("KESTREL")[0]["text"]
        .as_str()
        .unwrap()
        .contains("AN ORDINARY KESTREL"));

    // A bad table is a usage error naming the line.
    std::fs::write(&config, "[loaders]\n\"\" = \"cat\"\n").unwrap();
    let out = rag(&["index", "--no-dense", "--index-dir"])
        .arg(idx.path())
        .arg(d)
        .env("RAG_CONFIG", &config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 1") && err.contains("loaders"), "{err}");
}
