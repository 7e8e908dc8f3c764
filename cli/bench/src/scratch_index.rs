//! An assistant over a benchmark corpus, indexed in a scratch directory that is removed
//! when the benchmark ends, whatever happens (the answer, conversation and end-to-end
//! benchmarks index the same way, so their numbers start from the same index).

use anyhow::{Context, Result};
use rag::assistant::{Assistant, AssistantOptions};
use rag::IndexOptions;
use std::path::Path;

/// A scratch index directory, deleted on drop.
pub struct ScratchDir(tempfile::TempDir);

impl ScratchDir {
    /// A new empty directory named `<prefix>...` in the system's temporary directory.
    pub fn new(prefix: &str) -> Result<Self> {
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .map(ScratchDir)
            .context("creating a scratch index directory")
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// An assistant on `model` with its index in `index_dir`; `corpus`, if given, is indexed
/// first (pass it once when several assistants share one index).
pub fn open_assistant(
    index_dir: &ScratchDir,
    model: &str,
    threads: usize,
    corpus: Option<&Path>,
) -> Result<Assistant> {
    open_assistant_with(index_dir, model, threads, corpus, |_| {})
}

/// [`open_assistant`] with `tweak` applied to the options before opening.
pub fn open_assistant_with(
    index_dir: &ScratchDir,
    model: &str,
    threads: usize,
    corpus: Option<&Path>,
    tweak: impl FnOnce(&mut AssistantOptions),
) -> Result<Assistant> {
    let mut opts = AssistantOptions::new(index_dir.path());
    opts.model = model.to_owned();
    opts.threads = threads;
    tweak(&mut opts);
    let assistant = Assistant::open(opts)?;
    if let Some(corpus) = corpus {
        assistant.add_paths(&[corpus.to_path_buf()], &IndexOptions::default(), &|_| {})?;
    }
    Ok(assistant)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_goes_with_its_owner() {
        let dir = ScratchDir::new("rag-bench-test-").unwrap();
        let path = dir.path().to_path_buf();
        assert!(path.is_dir());
        drop(dir);
        assert!(!path.exists());
    }
}
