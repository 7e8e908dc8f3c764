//! End-to-end over real files: walk a temp tree, parse each kind, chunk.

use corpus_tools::walk::{walk, WalkOptions};
use corpus_tools::{chunk_doc, parse_isolated, ChunkOptions, DocKind, ParseLimits, SkipReason};
use std::fs;

fn write_pdf(path: &std::path::Path, pages: &[&str]) {
    corpus_tools::test_support::write_pdf(path, pages).unwrap();
}

#[test]
fn walk_respects_gitignore_and_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(d.join(".gitignore"), "ignored.txt\nbuild/\n").unwrap();
    fs::write(d.join("keep.txt"), "keep").unwrap();
    fs::write(d.join("ignored.txt"), "no").unwrap();
    fs::create_dir(d.join("build")).unwrap();
    fs::write(d.join("build/out.txt"), "no").unwrap();
    fs::create_dir(d.join(".hidden")).unwrap();
    fs::write(d.join(".hidden/secret.txt"), "no").unwrap();
    fs::create_dir(d.join("sub")).unwrap();
    fs::write(d.join("sub/deep.md"), "# yes").unwrap();
    fs::create_dir(d.join("idx")).unwrap();
    fs::write(d.join("idx/db"), "no").unwrap();
    let opts = WalkOptions {
        include_hidden: false,
        exclude: vec![d.join("idx")],
    };
    let (files, errors) = walk(&[d.to_path_buf()], &opts);
    assert!(errors.is_empty());
    let names: Vec<String> = files
        .iter()
        .map(|p| p.strip_prefix(d).unwrap().display().to_string())
        .collect();
    assert_eq!(names, vec!["keep.txt", "sub/deep.md"]);
}

#[test]
fn pdf_pages_html_headings_and_binary_skip() {
    let dir = tempfile::tempdir().unwrap();
    let pdf = dir.path().join("doc.pdf");
    write_pdf(
        &pdf,
        &[
            "First page talks about otters",
            "Second page talks about beavers",
        ],
    );
    let limits = ParseLimits::default();
    let doc = parse_isolated(&pdf, fs::read(&pdf).unwrap(), &limits).unwrap();
    assert_eq!(doc.kind, DocKind::Pdf);
    let chunks = chunk_doc(
        &doc,
        &ChunkOptions::default(),
        &corpus_tools::tokens::estimate_tokens,
    );
    assert_eq!(chunks.len(), 2);
    assert_eq!(chunks[1].page, Some(2));
    assert!(chunks[1].text.contains("beavers"));

    let html = b"<html><body><h1>Manual</h1><p>Intro.</p><h2>Setup</h2><p>Plug the <b>red</b> cable.</p></body></html>";
    let doc = parse_isolated(std::path::Path::new("m.html"), html.to_vec(), &limits).unwrap();
    let chunks = chunk_doc(
        &doc,
        &ChunkOptions::default(),
        &corpus_tools::tokens::estimate_tokens,
    );
    let setup = chunks.iter().find(|c| c.text.contains("red")).unwrap();
    assert_eq!(setup.heading.as_deref(), Some("Manual > Setup"));
    assert_eq!(setup.lines, None);

    let bin = vec![0u8, 1, 2, 3, 0, 0, 7];
    assert_eq!(
        parse_isolated(std::path::Path::new("blob"), bin, &limits),
        Err(SkipReason::Binary)
    );
}

#[test]
fn oversized_file_is_skipped_unread() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big.txt");
    fs::write(&p, "x".repeat(5000)).unwrap();
    assert_eq!(
        corpus_tools::load::read_file(&p, 1000).unwrap_err(),
        corpus_tools::Skip::new(SkipReason::TooLarge, "5000 bytes, over the 1000 byte limit")
    );
    assert_eq!(
        corpus_tools::load::read_file(&p, 10_000).unwrap().len(),
        5000
    );
    assert_eq!(
        corpus_tools::load::read_file(&dir.path().join("missing"), 10)
            .unwrap_err()
            .reason,
        SkipReason::Unreadable
    );
}
