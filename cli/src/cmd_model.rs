//! `rag model pull|list`.

use anyhow::{bail, Result};
use rag::models;

#[derive(clap::Subcommand)]
pub enum ModelCmd {
    /// Fetch a model into the cache (idempotent, sha256-verified).
    Pull { name: String },
    /// List known models and whether they are cached.
    List,
}

pub fn run(cmd: ModelCmd) -> Result<()> {
    match cmd {
        ModelCmd::Pull { name } => {
            let Some(entry) = models::find(&name) else {
                let names: Vec<String> = models::manifest().into_iter().map(|m| m.name).collect();
                bail!("unknown model '{name}' (known: {})", names.join(", "));
            };
            let path = models::pull(&entry, &mut |msg| eprintln!("{msg}"))?;
            println!("{}", path.display());
            Ok(())
        }
        ModelCmd::List => {
            println!("cache: {}", models::cache_dir().display());
            for m in models::manifest() {
                let state = if m.is_cached() {
                    "cached"
                } else if m.path().exists() {
                    "present, hash mismatch"
                } else {
                    "not downloaded"
                };
                let default = match m.name.as_str() {
                    models::DEFAULT_MODEL => " (default LLM)",
                    models::DEFAULT_EMBEDDER => " (default embedder)",
                    _ => "",
                };
                println!(
                    "{:<22} {:<16} {}{}",
                    m.name,
                    state,
                    m.path().display(),
                    default
                );
            }
            let dir = rag::models::weights_cache_dir();
            let (files, bytes) = npu_runtime::weights_cache::usage(&dir);
            println!(
                "repacked weights: {files} file(s), {:.2} GB in {} (rebuilt when missing; safe to delete)",
                bytes as f64 / 1e9,
                dir.display()
            );
            Ok(())
        }
    }
}
