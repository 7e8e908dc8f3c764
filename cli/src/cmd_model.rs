//! `rag model pull|list|rm`.

use anyhow::{Context, Result};
use rag::models;
use rag_cli::exit;
use std::path::Path;

#[derive(clap::Subcommand)]
pub enum ModelCmd {
    /// Fetch a model into the cache (idempotent, sha256-verified, resumable).
    Pull {
        /// A name from `rag model list`, or a Hub reference: hf.co/OWNER/REPO:QUANT or
        /// hf.co/OWNER/REPO/FILE.gguf.
        name: String,
    },
    /// List known models and whether they are cached.
    List,
    /// Delete a cached model (and its repacked weights) from the cache.
    Rm {
        /// A name or Hub reference from `rag model list`.
        name: String,
    },
}

/// The manifest entry named `name`, or a missing-model error listing the known names.
fn entry(name: &str) -> Result<models::ModelEntry> {
    models::find(name).ok_or_else(|| {
        let names: Vec<String> = models::manifest().into_iter().map(|m| m.name).collect();
        exit::missing_model(format!(
            "unknown model '{name}' (known: {}; or a Hub reference hf.co/OWNER/REPO:QUANT or \
             hf.co/OWNER/REPO/FILE.gguf)",
            names.join(", ")
        ))
    })
}

pub fn run(cmd: ModelCmd) -> Result<()> {
    match cmd {
        ModelCmd::Pull { name } => {
            if !models::is_known(&name) {
                entry(&name)?;
            }
            let path = models::pull_named(&name, &mut |msg| eprintln!("{msg}"))?;
            println!("{}", path.display());
            Ok(())
        }
        ModelCmd::Rm { name } => {
            let path = if models::HubRef::looks_like(&name) {
                models::HubRef::parse(&name)?;
                models::resolve(&name).map_err(|e| exit::missing_model(format!("{e:#}")))?
            } else {
                entry(&name)?.path()
            };
            if !path.exists() {
                return Err(exit::missing_model(format!(
                    "model '{name}' is not downloaded (nothing at {})",
                    path.display()
                )));
            }
            let mut freed = 0;
            let removed = if path.is_dir() {
                freed += dir_bytes(&path);
                std::fs::remove_dir_all(&path)
            } else {
                // The repacked weights are keyed by the model file's canonical path.
                let repacked =
                    npu_runtime::weights_cache::cache_path(&models::weights_cache_dir(), &path);
                if let Ok(m) = std::fs::metadata(&repacked) {
                    std::fs::remove_file(&repacked)
                        .with_context(|| format!("removing {}", repacked.display()))?;
                    freed += m.len();
                }
                let _ = std::fs::remove_file(models::verified_record(&path));
                freed += std::fs::metadata(&path).map_or(0, |m| m.len());
                std::fs::remove_file(&path)
            };
            removed.with_context(|| format!("removing {}", path.display()))?;
            println!(
                "removed {name} ({:.2} GB freed): {}",
                freed as f64 / 1e9,
                path.display()
            );
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
                    rag::embed::E5_EMBEDDER => " (multilingual embedder: rag index --embedder)",
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
            let hub = models::hub_downloads(&models::cache_dir());
            if !hub.is_empty() {
                println!("downloaded from the Hub:");
            }
            for (reference, path) in hub {
                println!("{reference:<60} {}", path.display());
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

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |es| {
        es.flatten()
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    })
}
