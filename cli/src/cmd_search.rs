//! `rag search "QUERY"`: ranked chunks with scores and locations.

use anyhow::Result;
use rag::{Hit, Index, SearchMode};
use rag_cli::config::Config;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// What to search for.
    pub query: String,
    /// Where the index lives [default: $RAG_INDEX_DIR, the config file's index_dir, or
    /// .rag-index].
    #[arg(long)]
    pub index_dir: Option<PathBuf>,
    /// Passages to show [default: the config file's top_k, or 5].
    #[arg(long, short = 'k')]
    pub top_k: Option<usize>,
    /// hybrid (BM25 + dense, fused), bm25 or dense.
    #[arg(long, default_value_t = rag::assistant::AskOptions::default().mode,
          value_parser = rag_cli::search_mode_parser())]
    pub mode: SearchMode,
    /// BM25 only: do not load the embedding model.
    #[arg(long)]
    pub no_dense: bool,
    /// Print the hits as JSON (docs/json-schemas.md).
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<()> {
    let config = Config::load()?;
    let index_dir = config.index_dir(a.index_dir);
    rag_cli::exit::require_index(&index_dir, "")?;
    let mode = if a.no_dense { SearchMode::Bm25 } else { a.mode };
    let embedder = rag_cli::embedder::load_embedder(mode == SearchMode::Bm25, &index_dir, None)?;
    let index = Index::open(&index_dir, embedder)?;
    let hits = index.search(&a.query, config.top_k(a.top_k), mode)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&hits)?);
        return Ok(());
    }
    if hits.is_empty() {
        println!("no results");
    }
    for (i, h) in hits.iter().enumerate() {
        println!(
            "{}. {}  score {:.4}{}",
            i + 1,
            location(h),
            h.score,
            ranks(h)
        );
        if let Some(head) = &h.heading {
            println!("   [{head}]");
        }
        for line in h.text.lines().filter(|l| !l.trim().is_empty()).take(3) {
            let line: String = line.chars().take(110).collect();
            println!("   {line}");
        }
    }
    Ok(())
}

/// `path:12-20` or `path (page 3)`, with the path relative to the working directory.
pub fn location(h: &Hit) -> String {
    let cwd = std::env::current_dir().ok();
    let p = Path::new(&h.path);
    let shown = cwd
        .as_deref()
        .and_then(|c| p.strip_prefix(c).ok())
        .unwrap_or(p);
    let mut s = shown.display().to_string();
    if let Some((a, b)) = h.lines {
        s += &format!(":{a}-{b}");
    }
    if let Some(pg) = h.page {
        s += &format!(" (page {pg})");
    }
    s
}

fn ranks(h: &Hit) -> String {
    let r = |x: Option<usize>| x.map(|v| format!("#{v}")).unwrap_or_else(|| "-".into());
    match (h.bm25_rank, h.dense_rank) {
        (None, None) => String::new(),
        (b, d) => format!("  (bm25 {}, dense {})", r(b), r(d)),
    }
}
