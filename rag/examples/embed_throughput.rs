//! Embedding throughput of the MiniLM embedder on real chunks: walks a corpus, chunks it the
//! way `rag index` does (default options), and embeds the first N chunks in the indexer's
//! batch size with each weight format, interleaving the formats round by round so a loaded
//! machine slows them alike.
//!
//! ```text
//! cargo run --release -p rag --example embed_throughput -- /usr/share/doc 512 [rounds] [threads]
//! ```

use anyhow::{Context, Result};
use corpus_tools::{chunk_doc, parse_isolated, ChunkOptions, ParseLimits};
use rag::embed::MiniLmEmbedder;
use rag::embed::WeightFormat;
use rag::Embedder;
use std::path::PathBuf;
use std::time::Instant;

/// Chunks per `embed_batch` call, as `IndexOptions::default().embed_batch`.
const BATCH: usize = 32;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = PathBuf::from(args.first().map_or("/usr/share/doc", |s| s.as_str()));
    let want: usize = args.get(1).map_or(Ok(512), |s| s.parse())?;
    let rounds: usize = args.get(2).map_or(Ok(2), |s| s.parse())?;
    let threads: Option<usize> = args.get(3).map(|s| s.parse()).transpose()?;

    let dir = MiniLmEmbedder::default_dir();
    let mut models = Vec::new();
    for (name, format) in [("f32", WeightFormat::F32), ("q8_0", WeightFormat::Q8_0)] {
        let mut e = MiniLmEmbedder::load_with(&dir, format)?;
        if let Some(t) = threads {
            e.set_threads(t);
        }
        models.push((name, e));
    }
    let counter = |s: &str| corpus_tools::tokens::estimate_tokens(s);
    let (files, _) = corpus_tools::walk::walk(std::slice::from_ref(&root), &Default::default());
    let mut texts = Vec::new();
    for f in &files {
        if texts.len() >= want {
            break;
        }
        let Ok(bytes) = corpus_tools::load::read_file(f, 1 << 20) else {
            continue;
        };
        let Ok(doc) = parse_isolated(f, bytes, &ParseLimits::default()) else {
            continue;
        };
        texts.extend(
            chunk_doc(&doc, &ChunkOptions::default(), &counter)
                .into_iter()
                .map(|c| c.text),
        );
    }
    texts.truncate(want);
    anyhow::ensure!(!texts.is_empty(), "no chunks under {}", root.display());
    let tokens: usize = texts
        .iter()
        .map(|t| models[0].1.token_ids(t).map(|v| v.len()))
        .sum::<Result<usize>>()
        .context("tokenizing")?;
    println!(
        "{} chunks from {}, {:.1} model tokens per chunk on average, {} encoder threads",
        texts.len(),
        root.display(),
        tokens as f64 / texts.len() as f64,
        threads.map_or_else(|| "all".to_string(), |t| t.to_string()),
    );
    let refs: Vec<&str> = texts.iter().map(|s| s.as_str()).collect();
    let mut best = vec![f64::INFINITY; models.len()];
    for round in 0..rounds {
        for (i, (name, e)) in models.iter().enumerate() {
            let t = Instant::now();
            for batch in refs.chunks(BATCH) {
                e.embed_batch(batch)?;
            }
            let s = t.elapsed().as_secs_f64();
            best[i] = best[i].min(s);
            println!(
                "round {round} {name}: {:.2} s, {:.1} chunks/s",
                s,
                texts.len() as f64 / s
            );
        }
    }
    for ((name, _), s) in models.iter().zip(&best) {
        println!(
            "best {name}: {:.1} chunks/s ({:.0} tokens/s)",
            texts.len() as f64 / s,
            tokens as f64 / s
        );
    }
    Ok(())
}
