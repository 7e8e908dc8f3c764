//! An Assistant over the bundled sample corpus with SmolLM2 (BM25 only, 2 threads), shared
//! by the Assistant test binaries.

use rag::assistant::{Assistant, AssistantOptions};
use rag::IndexOptions;
use std::path::{Path, PathBuf};

/// The options of [`sample_assistant`] (SmolLM2, BM25 only, 2 threads, 2048 KV slots).
pub fn sample_options(dir: &Path) -> AssistantOptions {
    let mut opts = AssistantOptions::new(dir);
    opts.model = "smollm2-135m".into();
    opts.dense = false;
    opts.threads = 2;
    opts.kv_capacity = 2048;
    opts
}

pub fn sample_assistant(dir: &Path) -> Assistant {
    let a = Assistant::open(sample_options(dir)).unwrap();
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/sample-corpus");
    a.add_paths(&[corpus], &IndexOptions::default(), &|_| {})
        .unwrap();
    a
}
