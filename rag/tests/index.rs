mod common;

use common::{write_corpus, write_pdf, HashEmbedder};
use rag::{Index, IndexOptions, SearchMode};
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn no_progress(_: rag::IndexProgress) {}

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn index_is_send_and_sync() {
    assert_send_sync::<Index>();
}

#[test]
fn indexes_searches_and_cites_locations() {
    let corpus = tempfile::tempdir().unwrap();
    let idx_dir = tempfile::tempdir().unwrap();
    write_corpus(corpus.path());
    let idx = Index::open(idx_dir.path(), None).unwrap();
    let s = idx
        .add_paths(
            &[corpus.path().to_path_buf()],
            &IndexOptions::default(),
            &no_progress,
        )
        .unwrap();
    assert_eq!(s.files_seen, 6);
    assert_eq!(s.files_indexed, 4);
    assert_eq!(s.skipped.get("unsupported"), Some(&1));
    assert_eq!(s.skipped.get("binary"), Some(&1));
    assert!(s.chunks_added >= 4);
    let stats = idx.stats();
    assert_eq!(stats.chunks, s.chunks_total);
    assert_eq!(stats.bm25_docs, stats.chunks);

    let hits = idx
        .search(
            "which port does the otter daemon listen on",
            3,
            SearchMode::Bm25,
        )
        .unwrap();
    let top = &hits[0];
    assert!(top.path.ends_with("guide/setup.md"), "{top:?}");
    assert!(top.text.contains("7311"));
    assert_eq!(top.heading.as_deref(), Some("Setup > Ports"));
    assert_eq!(top.lines, Some((5, 7)));
    assert_eq!(top.bm25_rank, Some(1));

    let hits = idx
        .search("boathouse opening", 1, SearchMode::Bm25)
        .unwrap();
    assert!(hits[0].path.ends_with("page.html"));
    assert_eq!(
        hits[0].heading.as_deref(),
        Some("Kayak rental > Opening hours")
    );
    assert_eq!(hits[0].lines, None);
    // Query syntax characters are plain text, not errors.
    assert!(idx
        .search("port:(7311) AND \"otter", 3, SearchMode::Bm25)
        .is_ok());
    assert!(idx.search("", 3, SearchMode::Bm25).unwrap().is_empty());
    // Dense without a model is a clear error; hybrid degrades to BM25.
    assert!(idx.search("otter", 3, SearchMode::Dense).is_err());
    assert_eq!(
        idx.search("otter port", 3, SearchMode::Hybrid).unwrap()[0].chunk_id,
        idx.search("otter port", 3, SearchMode::Bm25).unwrap()[0].chunk_id
    );
    let c = idx.chunk(top.chunk_id).unwrap().unwrap();
    assert_eq!(c.text, top.text);
    let mut n = 0;
    idx.for_each_chunk_text(&mut |_, t| n += t.len()).unwrap();
    assert!(n > 100);
}

#[test]
fn incremental_runs_touch_only_what_changed() {
    let corpus = tempfile::tempdir().unwrap();
    let idx_dir = tempfile::tempdir().unwrap();
    write_corpus(corpus.path());
    let emb = Arc::new(HashEmbedder::new());
    let idx = Index::open(idx_dir.path(), Some(emb.clone())).unwrap();
    let roots = [corpus.path().to_path_buf()];
    let opts = IndexOptions::default();
    let first = idx.add_paths(&roots, &opts, &no_progress).unwrap();
    assert_eq!(first.chunks_embedded, first.chunks_added);
    let gen1 = idx.generation();
    let fp1 = idx.fingerprint().unwrap();

    // Nothing changed: no parse, no embedding, no new generation.
    let texts_before = emb.texts.load(Ordering::SeqCst);
    let second = idx.add_paths(&roots, &opts, &no_progress).unwrap();
    assert_eq!(second.files_indexed, 0);
    assert_eq!(second.files_unchanged, 4);
    // The skipped files stay in the summary's count, by their reason, without a re-read.
    assert_eq!(second.skipped, first.skipped);
    assert_eq!(second.skipped_total(), 2);
    assert_eq!(second.chunks_added, 0);
    assert_eq!(second.chunks_embedded, 0);
    assert_eq!(emb.texts.load(Ordering::SeqCst), texts_before);
    assert_eq!(idx.generation(), gen1);
    assert_eq!(idx.fingerprint().unwrap(), fp1);

    // One file edited: only its new content is embedded.
    std::fs::write(
        corpus.path().join("notes.txt"),
        "Beavers build dams from branches and mud.\nOtters prefer fish.\n",
    )
    .unwrap();
    let third = idx.add_paths(&roots, &opts, &no_progress).unwrap();
    assert_eq!(third.files_indexed, 1);
    assert_eq!(third.chunks_added, 1);
    assert_eq!(third.chunks_removed, 1);
    assert_eq!(third.chunks_embedded, 1);
    assert!(idx
        .search("night", 5, SearchMode::Bm25)
        .unwrap()
        .iter()
        .all(|h| !h.text.contains("night")));
    let hits = idx
        .search("Otters prefer fish.", 1, SearchMode::Dense)
        .unwrap();
    assert!(hits[0].path.ends_with("notes.txt"));

    // Touching a file without changing it costs a hash, not a re-index.
    let p = corpus.path().join("main.rs");
    let content = std::fs::read(&p).unwrap();
    std::fs::write(&p, &content).unwrap();
    let fourth = idx.add_paths(&roots, &opts, &no_progress).unwrap();
    assert_eq!(fourth.files_indexed, 0);
    assert_eq!(fourth.chunks_added, 0);

    // A deleted file leaves the index, everywhere.
    std::fs::remove_file(corpus.path().join("page.html")).unwrap();
    let fifth = idx.add_paths(&roots, &opts, &no_progress).unwrap();
    assert_eq!(fifth.files_removed, 1);
    for mode in [SearchMode::Bm25, SearchMode::Dense, SearchMode::Hybrid] {
        assert!(idx
            .search("kayak rental boathouse", 10, mode)
            .unwrap()
            .iter()
            .all(|h| !h.path.ends_with("page.html")));
    }
    let st = idx.stats();
    assert_eq!(st.bm25_docs, st.chunks);
    assert_eq!(st.dense_vectors, st.chunks);

    // The same folder indexed from scratch gives the same content.
    let fresh_dir = tempfile::tempdir().unwrap();
    let fresh = Index::open(fresh_dir.path(), Some(Arc::new(HashEmbedder::new()))).unwrap();
    fresh.add_paths(&roots, &opts, &no_progress).unwrap();
    assert_eq!(fresh.fingerprint().unwrap(), idx.fingerprint().unwrap());
}

#[test]
fn dense_and_hybrid_rank_with_locations() {
    let corpus = tempfile::tempdir().unwrap();
    let idx_dir = tempfile::tempdir().unwrap();
    write_corpus(corpus.path());
    let idx = Index::open(idx_dir.path(), Some(Arc::new(HashEmbedder::new()))).unwrap();
    idx.add_paths(
        &[corpus.path().to_path_buf()],
        &IndexOptions::default(),
        &no_progress,
    )
    .unwrap();
    let hits = idx
        .search(
            "Beavers build dams from branches and mud.",
            3,
            SearchMode::Dense,
        )
        .unwrap();
    assert!(hits[0].path.ends_with("notes.txt"));
    assert_eq!(hits[0].dense_rank, Some(1));
    assert!(hits[0].score > 0.5 && hits[0].score <= 1.0001);
    let hits = idx.search("beavers dams", 3, SearchMode::Hybrid).unwrap();
    assert!(hits[0].path.ends_with("notes.txt"));
    assert_eq!(hits[0].bm25_rank, Some(1));
    assert!(hits[0].dense_rank.is_some());
    assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));

    // Reopening loads the dumped graph instead of re-embedding.
    drop(idx);
    let emb = Arc::new(HashEmbedder::new());
    let idx = Index::open(idx_dir.path(), Some(emb.clone())).unwrap();
    assert_eq!(emb.texts.load(Ordering::SeqCst), 0);
    assert_eq!(idx.stats().dense_vectors, idx.stats().chunks);
    assert!(idx
        .search("kayak euros per hour", 1, SearchMode::Dense)
        .unwrap()[0]
        .path
        .ends_with("page.html"));
}

#[test]
fn derived_indexes_are_rebuilt_from_the_store() {
    let corpus = tempfile::tempdir().unwrap();
    let idx_dir = tempfile::tempdir().unwrap();
    write_corpus(corpus.path());
    let roots = [corpus.path().to_path_buf()];
    let fp = {
        let idx = Index::open(idx_dir.path(), Some(Arc::new(HashEmbedder::new()))).unwrap();
        idx.add_paths(&roots, &IndexOptions::default(), &no_progress)
            .unwrap();
        idx.fingerprint().unwrap()
    };
    // Lose both derived indexes, as if a crash hit right after the store commit.
    std::fs::remove_dir_all(idx_dir.path().join("bm25")).unwrap();
    std::fs::remove_file(idx_dir.path().join("dense.json")).unwrap();
    let idx = Index::open(idx_dir.path(), Some(Arc::new(HashEmbedder::new()))).unwrap();
    // A reader rebuilds the graph in memory; BM25 waits for the next writer.
    assert_eq!(idx.stats().dense_vectors, idx.stats().chunks);
    let s = idx
        .add_paths(&roots, &IndexOptions::default(), &no_progress)
        .unwrap();
    assert_eq!(s.chunks_added, 0);
    assert_eq!(idx.fingerprint().unwrap(), fp);
    let st = idx.stats();
    assert_eq!(st.bm25_docs, st.chunks);
    assert!(idx.search("otter port", 1, SearchMode::Bm25).unwrap()[0]
        .text
        .contains("7311"));
    assert!(idx_dir.path().join("dense.json").exists());
}

#[test]
fn remove_path_and_reader_during_write() {
    let corpus = tempfile::tempdir().unwrap();
    let idx_dir = tempfile::tempdir().unwrap();
    write_corpus(corpus.path());
    let roots = vec![corpus.path().to_path_buf()];
    let writer = Arc::new(Index::open(idx_dir.path(), None).unwrap());
    writer
        .add_paths(&roots, &IndexOptions::default(), &no_progress)
        .unwrap();
    // Add many files while a second handle (as another process would) keeps searching.
    for i in 0..200 {
        std::fs::write(
            corpus.path().join(format!("extra{i}.txt")),
            format!("filler document number {i} about herons\n"),
        )
        .unwrap();
    }
    let reader = Index::open(idx_dir.path(), None).unwrap();
    let w = writer.clone();
    let r2 = roots.clone();
    let opts = IndexOptions {
        commit_every_chunks: 10,
        ..Default::default()
    };
    let t = std::thread::spawn(move || w.add_paths(&r2, &opts, &no_progress).unwrap());
    let mut searches = 0;
    while searches == 0 || !t.is_finished() {
        let hits = reader
            .search("otter daemon port", 1, SearchMode::Bm25)
            .unwrap();
        assert!(hits[0].text.contains("7311"));
        searches += 1;
    }
    let s = t.join().unwrap();
    assert_eq!(s.files_indexed, 200);
    assert!(searches > 0);
    assert_eq!(
        reader
            .search("herons", 500, SearchMode::Bm25)
            .unwrap()
            .len(),
        200
    );
    // A second writer cannot run at the same time.
    let _ = writer;
    let removed = reader.remove_path(&corpus.path().join("guide")).unwrap();
    assert_eq!(removed, 1);
    assert!(reader
        .search("otter daemon port", 5, SearchMode::Bm25)
        .unwrap()
        .iter()
        .all(|h| !h.path.contains("guide")));
}

#[test]
fn missing_root_is_a_clear_error() {
    let idx_dir = tempfile::tempdir().unwrap();
    let idx = Index::open(idx_dir.path(), None).unwrap();
    let err = idx
        .add_paths(
            &[idx_dir.path().join("nope")],
            &IndexOptions::default(),
            &no_progress,
        )
        .unwrap_err();
    assert!(format!("{err:#}").contains("no such file"));
}

/// Every input kind the issue names, through the real indexer: what is indexed, with which
/// location and heading path, and what is skipped (and counted) instead.
#[test]
fn every_format_and_every_skip_through_the_indexer() {
    use std::fs;
    let corpus = tempfile::tempdir().unwrap();
    let d = corpus.path();
    fs::write(d.join(".gitignore"), "drafts/\nscratch.txt\n").unwrap();
    fs::create_dir_all(d.join("drafts")).unwrap();
    fs::write(
        d.join("drafts/plan.md"),
        "# Plan\n\nzanzibar ignored draft\n",
    )
    .unwrap();
    fs::write(d.join("scratch.txt"), "zanzibar ignored scratch\n").unwrap();
    fs::create_dir_all(d.join(".private")).unwrap();
    fs::write(d.join(".private/notes.txt"), "zanzibar hidden dir\n").unwrap();
    fs::write(d.join(".hidden.txt"), "zanzibar hidden file\n").unwrap();
    fs::write(
        d.join("manual.md"),
        "# Manual\n\nIntro.\n\n## Pairing\n\n### Sensors\n\nHold PAIR for five seconds to pair a wombat sensor.\n",
    )
    .unwrap();
    write_pdf(
        &d.join("leaflet.pdf"),
        &[
            "Page one is about quokkas.",
            "Page two: the numbat eats termites.",
        ],
    );
    fs::write(
        d.join("faq.html"),
        "<html><body><h1>FAQ</h1><h2>Billing</h2><p>Invoices arrive by pelican post.</p></body></html>",
    )
    .unwrap();
    fs::write(
        d.join("tool.rs"),
        "// helper\n\nfn dingo_checksum(x: u64) -> u64 {\n    x ^ 0x5bd1e995\n}\n",
    )
    .unwrap();
    // Rendered man page text (`man tool | col -b`) and roff source.
    fs::write(
        d.join("tool.txt"),
        "TOOL(1)    User Commands    TOOL(1)\n\nNAME\n       tool - count platypus eggs\n\nDESCRIPTION\n       tool counts the eggs of every platypus in the burrow.\n",
    )
    .unwrap();
    fs::write(
        d.join("tool.1"),
        ".TH TOOL 1\n.SH NAME\ntool \\- count eggs\n.SH OPTIONS\n.TP\n.B \\-v\nPrint every bandicoot it meets.\n",
    )
    .unwrap();
    fs::write(d.join("photo.png"), [0x89u8, b'P', b'N', b'G', 0, 0, 0, 0]).unwrap();
    fs::write(d.join("data.unknownext"), [7u8, 0, 9, 0, 200, 0]).unwrap();
    // A 2 GiB file (sparse: costs no disk) is skipped unread, by its size.
    let huge = fs::File::create(d.join("huge.log")).unwrap();
    huge.set_len(2 << 30).unwrap();
    drop(huge);

    let idx_dir = tempfile::tempdir().unwrap();
    let idx = Index::open(idx_dir.path(), None).unwrap();
    let t = std::time::Instant::now();
    let s = idx
        .add_paths(&[d.to_path_buf()], &IndexOptions::default(), &no_progress)
        .unwrap();
    // Correctness, not speed: "unread" means seconds, not the minutes 2 GiB would take.
    assert!(t.elapsed() < std::time::Duration::from_secs(60));
    // Hidden and ignored files are not even seen.
    assert_eq!(s.files_seen, 9, "{s:?}");
    assert_eq!(s.files_indexed, 6, "{s:?}");
    assert_eq!(s.skipped.get("unsupported"), Some(&1), "{s:?}");
    assert_eq!(s.skipped.get("binary"), Some(&1), "{s:?}");
    assert_eq!(s.skipped.get("too-large"), Some(&1), "{s:?}");
    // Each skipped file by path, with what exactly and, for a limit, the flag that moves it.
    let skipped: Vec<(String, &str, &str)> = s
        .skipped_files
        .iter()
        .map(|f| {
            let name = f.path.rsplit('/').next().unwrap().to_string();
            (name, f.reason.as_str(), f.detail.as_str())
        })
        .collect();
    assert_eq!(skipped.len(), 3, "{skipped:?}");
    assert!(skipped.contains(&("photo.png".into(), "unsupported", ".png file")));
    assert!(skipped.contains(&("data.unknownext".into(), "binary", "NUL bytes")));
    assert!(skipped.contains(&(
        "huge.log".into(),
        "too-large",
        "2048.0 MiB, over the 20 MiB limit (--max-file-mb)"
    )));
    assert!(idx
        .search("zanzibar", 10, SearchMode::Bm25)
        .unwrap()
        .is_empty());

    let top = |q: &str| {
        idx.search(q, 1, SearchMode::Bm25)
            .unwrap()
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no hit for {q}"))
    };
    let h = top("wombat sensor");
    assert!(h.path.ends_with("manual.md"));
    assert_eq!(h.heading.as_deref(), Some("Manual > Pairing > Sensors"));
    assert_eq!(h.lines, Some((7, 9)));
    let h = top("numbat termites");
    assert!(h.path.ends_with("leaflet.pdf"));
    assert_eq!((h.page, h.lines), (Some(2), None));
    assert!(!h.text.contains("quokkas"), "one chunk per page: {h:?}");
    let h = top("pelican invoices");
    assert!(h.path.ends_with("faq.html"));
    assert_eq!(h.heading.as_deref(), Some("FAQ > Billing"));
    let h = top("dingo_checksum");
    assert!(h.path.ends_with("tool.rs"));
    assert_eq!(h.lines, Some((1, 5)));
    let h = top("platypus burrow");
    assert!(h.path.ends_with("tool.txt"));
    assert_eq!(h.heading.as_deref(), Some("DESCRIPTION"));
    let h = top("bandicoot");
    assert!(h.path.ends_with("tool.1"));
    assert_eq!(h.heading.as_deref(), Some("TOOL(1) > OPTIONS"));
    assert!(!h.text.contains("\\-"), "roff escapes stripped: {h:?}");

    // A re-run re-reads nothing and still reports the skipped files.
    let again = idx
        .add_paths(&[d.to_path_buf()], &IndexOptions::default(), &no_progress)
        .unwrap();
    assert_eq!(again.files_indexed, 0);
    assert_eq!(again.files_unchanged, 6);
    assert_eq!(again.skipped, s.skipped);
    assert_eq!(again.skipped_files, s.skipped_files);
}

/// Files as users have them: every encoding of corpus-tools' corpus (BOMs, UTF-16, legacy
/// 8-bit and East Asian encodings, declared charsets, mixed line endings, a few corrupt
/// bytes) is indexed, found by its accented, Cyrillic, Greek or CJK word and cited at the
/// word's line; real binaries are skipped as binary, by path, with what gave them away.
#[test]
fn every_encoding_is_searchable_and_cited_at_its_line() {
    use corpus_tools::test_support::{binary_files, write_encoding_corpus};
    let corpus = tempfile::tempdir().unwrap();
    let d = corpus.path();
    let files = write_encoding_corpus(d).unwrap();
    let binaries = binary_files();
    for (name, bytes, _) in &binaries {
        std::fs::write(d.join(name), bytes).unwrap();
    }
    let idx_dir = tempfile::tempdir().unwrap();
    let idx = Index::open(idx_dir.path(), None).unwrap();
    let mut opts = IndexOptions::default();
    // Small chunks: a citation must pin the word's line, not the whole file.
    opts.chunk.chunk_tokens = 24;
    opts.chunk.overlap_tokens = 0;
    let s = idx
        .add_paths(&[d.to_path_buf()], &opts, &no_progress)
        .unwrap();
    assert_eq!(s.files_indexed as usize, files.len(), "{s:?}");
    assert_eq!(
        s.skipped.get("binary"),
        Some(&(binaries.len() as u64)),
        "{s:?}"
    );
    for (name, _, detail) in &binaries {
        let f = s
            .skipped_files
            .iter()
            .find(|f| f.path.ends_with(&format!("/{name}")))
            .unwrap_or_else(|| panic!("{name} not listed: {:?}", s.skipped_files));
        assert_eq!(f.reason, "binary");
        assert!(f.detail.contains(detail), "{f:?}");
    }
    for f in &files {
        let hits = idx.search(f.word, 1, SearchMode::Bm25).unwrap();
        let h = hits
            .first()
            .unwrap_or_else(|| panic!("{} ({}): no hit for {}", f.name, f.encoding, f.word));
        assert!(h.path.ends_with(&format!("/{}", f.name)), "{f:?}: {h:?}");
        assert!(h.text.contains(f.word), "{f:?}: {h:?}");
        match f.line {
            Some(n) => {
                let (a, b) = h.lines.unwrap_or_else(|| panic!("{f:?}: {h:?}"));
                assert!(a <= n && n <= b && b - a <= 3, "{f:?}: lines {a}-{b}");
            }
            None => assert_eq!(h.lines, None, "{f:?}"),
        }
    }
}

/// The index remembers the roots it was built from (with their document counts), a file
/// deleted from disk can still be removed by its path, and removing a root forgets it.
#[test]
fn roots_are_remembered_and_forgotten_by_remove_path() {
    let corpus = tempfile::tempdir().unwrap();
    let idx_dir = tempfile::tempdir().unwrap();
    write_corpus(corpus.path());
    let idx = Index::open(idx_dir.path(), None).unwrap();
    assert!(idx.roots().unwrap().is_empty());
    assert_eq!(idx.updated_unix(), None);
    idx.add_paths(
        &[corpus.path().to_path_buf()],
        &IndexOptions::default(),
        &no_progress,
    )
    .unwrap();
    let roots = idx.roots().unwrap();
    assert_eq!(roots.len(), 1, "{roots:?}");
    let root = &roots[0];
    assert_eq!(
        root.path,
        corpus.path().canonicalize().unwrap().to_string_lossy()
    );
    assert_eq!((root.documents, root.skipped_documents), (4, 2));
    assert!(root.synced_unix.is_some_and(|t| t >= root.added_unix));
    assert!(idx.updated_unix().is_some());
    // Reopening (another process) sees the same roots.
    drop(idx);
    let idx = Index::open(idx_dir.path(), None).unwrap();
    assert_eq!(idx.roots().unwrap(), roots);

    let gone = corpus.path().join("guide");
    let files: Vec<_> = std::fs::read_dir(&gone).unwrap().collect();
    assert_eq!(files.len(), 1);
    std::fs::remove_dir_all(&gone).unwrap();
    assert_eq!(idx.remove_path(&gone).unwrap(), 1);
    assert_eq!(idx.roots().unwrap()[0].documents, 3);
    assert_eq!(idx.remove_path(corpus.path()).unwrap(), 5);
    assert!(idx.roots().unwrap().is_empty());
    assert_eq!(idx.stats().documents + idx.stats().skipped_documents, 0);
}
