//! An Assistant over the bundled sample corpus with SmolLM2 (BM25 only, 2 threads), shared
//! by the Assistant test binaries.

use rag::assistant::{Assistant, AssistantOptions};
use rag::IndexOptions;
use std::path::{Path, PathBuf};

pub fn sample_assistant(dir: &Path) -> Assistant {
    let mut opts = AssistantOptions::new(dir);
    opts.model = "smollm2-135m".into();
    opts.dense = false;
    opts.threads = 2;
    opts.kv_capacity = 2048;
    let a = Assistant::open(opts).unwrap();
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/sample-corpus");
    a.add_paths(&[corpus], &IndexOptions::default(), &|_| {})
        .unwrap();
    a
}
