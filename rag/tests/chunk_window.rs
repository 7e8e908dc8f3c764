//! Chunks fit the embedder's input window when its real tokenizer is loaded: on text the
//! word-piece estimate under-counts (hashes, versions, addresses: changelog-like lines),
//! estimate-sized chunks overflow MiniLM's 256 tokens, chunks made by `rag index` with the
//! embedder do not, even when one "word" alone is longer than the window.

use corpus_tools::{chunk_doc, parse_isolated, ChunkOptions, ParseLimits};
use rag::embed::{MiniLmEmbedder, MAX_TOKENS};
use rag::{Index, IndexOptions};
use std::sync::Arc;

fn model_dir() -> Option<std::path::PathBuf> {
    let dir = MiniLmEmbedder::default_dir();
    if dir.join("model.safetensors").is_file() {
        return Some(dir);
    }
    if std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        return None;
    }
    panic!(
        "{} missing: run `scripts/fetch-model.sh minilm-l6-v2`",
        dir.display()
    );
}

/// Changelog-style lines, deterministic but varied (a small LCG picks the digits).
fn changelog(lines: usize) -> String {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 33
    };
    let mut s = String::new();
    for i in 0..lines {
        let (a, b, c) = (next(), next(), next());
        s.push_str(&format!(
            "  * {:012x} zstd {}.{}.{}-{}ubuntu0.{}: fix CVE-20{}-{} in ZSTD_decompressBlock_internal() (Closes: #{}) -- m{}@lists.example.org\n",
            a & 0xffff_ffff_ffff,
            b % 3,
            c % 10,
            a % 7,
            b % 5,
            i % 4,
            10 + c % 15,
            1000 + a % 9000,
            100_000 + b % 900_000,
            c % 97
        ));
    }
    s
}

#[test]
fn no_chunk_exceeds_the_embedder_window() {
    let Some(dir) = model_dir() else { return };
    let mut tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    tok.with_truncation(None).unwrap();
    tok.with_padding(None);
    let real = |t: &str| tok.encode(t, true).unwrap().len(); // [CLS] and [SEP] included

    let corpus = tempfile::tempdir().unwrap();
    let file = corpus.path().join("changelog");
    // Plus a Markdown-style table rule: one whitespace-free "word" of ~600 tokens.
    let text = format!("{}|{}|\n{}", changelog(30), "-".repeat(600), changelog(30));
    std::fs::write(&file, text).unwrap();

    // The corpus really overflows with estimate-bounded chunks (the old behaviour).
    let doc = parse_isolated(
        &file,
        std::fs::read(&file).unwrap(),
        &ParseLimits::default(),
    )
    .unwrap();
    let estimated = chunk_doc(
        &doc,
        &ChunkOptions::default(),
        &corpus_tools::tokens::estimate_tokens,
    );
    let worst = estimated.iter().map(|c| real(&c.text)).max().unwrap();
    assert!(
        worst > MAX_TOKENS,
        "test corpus no longer overflows the estimate ({worst} tokens)"
    );

    let emb = Arc::new(MiniLmEmbedder::load_configured(&dir).unwrap());
    let index_dir = tempfile::tempdir().unwrap();
    let index = Index::open(index_dir.path(), Some(emb.clone())).unwrap();
    // A chunk size above the window is capped to it.
    for chunk_tokens in [200, 400] {
        let mut opts = IndexOptions::default();
        opts.chunk.chunk_tokens = chunk_tokens;
        let summary = index
            .add_paths(&[corpus.path().to_path_buf()], &opts, &|_| {})
            .unwrap();
        assert_eq!(summary.files_indexed, 1, "config change re-chunks the file");
        let mut sizes = Vec::new();
        index
            .for_each_chunk_text(&mut |_, t| sizes.push(real(t)))
            .unwrap();
        assert!(sizes.len() >= 3);
        let max = *sizes.iter().max().unwrap();
        assert!(max <= MAX_TOKENS, "chunk of {max} real tokens");
        if chunk_tokens == 200 {
            assert!(
                max <= 202,
                "chunk of {max} real tokens over 200 + 2 special"
            );
        } else {
            assert!(max > 202, "the cap is the window, not the default size");
        }
    }
    // Unchanged options: nothing re-chunked.
    let mut opts = IndexOptions::default();
    opts.chunk.chunk_tokens = 400;
    let again = index
        .add_paths(&[corpus.path().to_path_buf()], &opts, &|_| {})
        .unwrap();
    assert_eq!((again.files_indexed, again.files_unchanged), (0, 1));
}
