//! `rag rm PATH...`: remove files, or every file under a folder, from the index (the files
//! on disk stay). A removed folder the index was built from is forgotten, so `rag index`
//! no longer re-syncs it.

use anyhow::Result;
use rag::Index;
use rag_cli::config::Config;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Files or folders to remove from the index (they need not exist any more).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Where the index lives [default: $RAG_INDEX_DIR, the config file's index_dir, or
    /// .rag-index].
    #[arg(long)]
    pub index_dir: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    let index_dir = Config::load()?.index_dir(a.index_dir);
    rag_cli::exit::require_index(&index_dir, "")?;
    // The dense graph is rewritten without the removed chunks when the index has vectors
    // and the embedder is here; otherwise the next dense search rebuilds it from the store.
    let has_vectors = Index::open(&index_dir, None)?.stats().vectors > 0;
    let embedder = if has_vectors {
        rag_cli::embedder::load_embedder(false, &index_dir, None).unwrap_or(None)
    } else {
        None
    };
    let index = Index::open(&index_dir, embedder)?;
    for path in &a.paths {
        let before = index.roots()?;
        let removed = index.remove_path(path)?;
        let after = index.roots()?;
        let forgotten: Vec<&str> = before
            .iter()
            .filter(|r| !after.iter().any(|x| x.path == r.path))
            .map(|r| r.path.as_str())
            .collect();
        anyhow::ensure!(
            removed > 0 || !forgotten.is_empty(),
            "nothing in the index at {} is at or under {}",
            index.dir().display(),
            path.display()
        );
        println!("removed {removed} file(s) under {}", path.display());
        for f in &forgotten {
            println!("forgot folder {f}");
        }
        // Still on disk under a folder that stays: a re-sync would bring it back.
        if let Ok(p) = path.canonicalize() {
            if let Some(r) = after.iter().find(|r| p.starts_with(Path::new(&r.path))) {
                eprintln!(
                    "note: {} is still on disk inside {}, which `rag index` re-syncs: it comes back then unless deleted or listed in an .ignore file",
                    path.display(),
                    r.path
                );
            }
        }
    }
    Ok(())
}
