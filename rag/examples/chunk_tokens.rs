//! How well the chunker's default token estimate matches the embedding model's real
//! WordPiece tokenizer, on real folders: chunks are cut to `--chunk-tokens` *estimated*
//! tokens, and the embedder truncates at 256 *real* tokens, so an under-estimate silently
//! drops the end of long chunks from the dense index.
//!
//!     cargo run --release -p rag --example chunk_tokens -- DIR... [--chunk-tokens 200] [--embedder]
//!
//! Prints, over every chunk `rag index` would make: the real/estimated ratio (total and
//! worst chunk), the largest chunk in real tokens, and how many chunks exceed the
//! embedder's 256-token window. Chunks are cut by the estimate (what `rag index` did
//! before, and still does without an embedder), or with `--embedder` by the embedder's
//! own tokenizer and window (`Embedder::chunk_tokenizer`, what `rag index` does with one).

use anyhow::{Context, Result};
use corpus_tools::walk::{walk, WalkOptions};
use corpus_tools::{chunk_doc, parse_isolated, ChunkOptions, ParseLimits};
use std::path::PathBuf;

fn main() -> Result<()> {
    let mut roots = Vec::new();
    let mut opts = ChunkOptions::default();
    let mut with_embedder = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--chunk-tokens" => {
                opts.chunk_tokens = args.next().context("--chunk-tokens N")?.parse()?;
            }
            "--embedder" => with_embedder = true,
            _ => roots.push(PathBuf::from(a)),
        }
    }
    anyhow::ensure!(
        !roots.is_empty(),
        "usage: chunk_tokens DIR... [--chunk-tokens N]"
    );
    let dir = rag::models::cache_dir().join(rag::models::DEFAULT_EMBEDDER);
    let mut tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json"))
        .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    // The shipped tokenizer.json truncates and pads: count the text's own tokens.
    tok.with_truncation(None)
        .map_err(|e| anyhow::anyhow!("cannot disable truncation: {e}"))?;
    tok.with_padding(None);
    let counter: rag::index::TokenCounter = if with_embedder {
        use rag::Embedder;
        let t = rag::embed::MiniLmEmbedder::load_configured(&dir)?
            .chunk_tokenizer()
            .context("the embedder has no tokenizer")?;
        opts.chunk_tokens = opts.chunk_tokens.min(t.max_text_tokens);
        t.count
    } else {
        std::sync::Arc::new(corpus_tools::tokens::estimate_tokens)
    };
    let limits = ParseLimits::default();
    let (files, _) = walk(&roots, &WalkOptions::default());
    let (mut chunks, mut est_sum, mut real_sum, mut over, mut max_real) = (0, 0, 0, 0, 0);
    let mut worst_ratio = 0f64;
    let mut over_by_kind = std::collections::BTreeMap::<&str, usize>::new();
    for f in &files {
        let Ok(bytes) = corpus_tools::load::read_file(f, limits.max_file_bytes) else {
            continue;
        };
        let Ok(doc) = parse_isolated(f, bytes, &limits) else {
            continue;
        };
        for c in chunk_doc(&doc, &opts, &*counter) {
            let est = corpus_tools::tokens::estimate_tokens(&c.text);
            // Special tokens included: the embedder's window counts [CLS] and [SEP] too.
            let real = tok
                .encode(c.text.as_str(), true)
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .len();
            chunks += 1;
            est_sum += est;
            real_sum += real;
            max_real = max_real.max(real);
            worst_ratio = worst_ratio.max(real as f64 / est.max(1) as f64);
            if real > rag::embed::MAX_TOKENS {
                over += 1;
                *over_by_kind.entry(doc.kind.as_str()).or_default() += 1;
            }
        }
    }
    println!(
        "{} files, {chunks} chunks (<= {} {} tokens): real/estimated {:.3} overall, worst chunk {:.2}; largest chunk {max_real} real tokens; {over} chunks ({:.2}%) over the embedder's {} tokens {:?}",
        files.len(),
        opts.chunk_tokens,
        if with_embedder { "embedder" } else { "estimated" },
        real_sum as f64 / est_sum.max(1) as f64,
        worst_ratio,
        100.0 * over as f64 / chunks.max(1) as f64,
        rag::embed::MAX_TOKENS,
        over_by_kind
    );
    Ok(())
}
